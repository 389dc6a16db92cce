#!/usr/bin/env bash
# Builds the controller's container image without a registry: a release build of the
# `external-endpoints` package, its run-time files staged by scripts/image-rootfs.sh, then the
# Dockerfile's final stage built by buildah from that folder: `--build-context build=DIR` stands
# in for the Dockerfile's build stage (which needs a Rust base image from a registry), so the image
# holds the same files, user, entrypoint and labels as a `docker build` of the Dockerfile.
#
# usage: scripts/image.sh [TAG]      TAG defaults to the workspace version
#        scripts/image.sh --print-ref  prints the image name and default tag and exits (the
#                                      chart's default image must be this one: tests/chart.rs)
#
# Writes to IMAGE_OUT (default: target/image, ignored by git):
#   oci/                         the image as an OCI image layout (one manifest, ref name TAG);
#                                `skopeo copy oci:target/image/oci:TAG docker-daemon:...` or
#                                `oci-archive:...` hands it to an engine
#   files.txt                    the image's files, one a line
#   external-endpoints.debug     the binary's debug info (not in the image), for profiling:
#                                the binary's .gnu_debuglink names it
# and prints the sizes. The release build goes to CARGO_TARGET_DIR (default: target).
# Needs cargo, buildah, objcopy (binutils) and ldd; `.ci/run` installs buildah with apt.
# buildah runs with a throw-away storage folder (vfs driver, chroot isolation): nothing is left
# in the machine's container storage, and no daemon is involved.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
if [[ ${1:-} == --print-ref ]]; then
  echo "external-endpoints:$version"
  exit 0
fi
tag=${1:-$version}
out=${IMAGE_OUT:-$root/target/image}
target=${CARGO_TARGET_DIR:-$root/target}
command -v buildah >/dev/null || { echo "$0: buildah is needed (apt-get install buildah)" >&2; exit 1; }

echo "==> cargo build --release -p external-endpoints (target: $target)"
cargo build --locked --release -p external-endpoints
binary=$target/release/external-endpoints

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/context"
echo "==> scripts/image-rootfs.sh"
scripts/image-rootfs.sh "$binary" "$work/build/rootfs" "$out/external-endpoints.debug" \
  >"$out/files.txt"

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's time as the image's creation time and every file's time: the same commit gives
# the same image config and layer.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
buildah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
echo "==> buildah bud (Dockerfile's final stage, build stage from the staged files)"
# An empty context: the final stage copies from the build stage only.
"${buildah[@]}" bud --quiet --isolation chroot --pull=never \
  -f "$root/Dockerfile" --build-context build="$work/build" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  --timestamp "$epoch" -t "external-endpoints:$tag" "$work/context" >/dev/null
rm -rf "$out/oci"
"${buildah[@]}" push --quiet "external-endpoints:$tag" "oci:$out/oci:$tag"

# Sizes: the binary as shipped, its debug info, the image as pulled (compressed layer + config
# + manifest) and unpacked (the files).
size() { stat -c %s "$1"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB (%d bytes)", b / 1048576, b }'; }
blobs=0
for blob in "$out"/oci/blobs/sha256/*; do blobs=$((blobs + $(size "$blob"))); done
unpacked=$(du -sb --apparent-size "$work/build/rootfs" | cut -f1)
echo "image external-endpoints:$tag: OCI layout $out/oci (ref $tag)"
echo "  binary (stripped of debug info): $(mib "$(size "$work/build/rootfs/usr/local/bin/external-endpoints")")"
echo "  debug info (separate): $(mib "$(size "$out/external-endpoints.debug")")"
echo "  release binary as cargo built it: $(mib "$(size "$binary")")"
echo "  image compressed (blobs): $(mib "$blobs")"
echo "  image unpacked ($(wc -l <"$out/files.txt") files): $(mib "$unpacked")"
