#!/usr/bin/env bash
# The controller image's files, made from a release binary. One list for both ways of building
# the image: scripts/image.sh runs this on the build machine, and the Dockerfile's build stage
# runs it inside rust:*-slim-bookworm; the Dockerfile's final stage copies the result as it is
# (`COPY --from=build /rootfs/ /`), and scripts/image.sh builds that same final stage.
#
# usage: scripts/image-rootfs.sh BINARY ROOTFS DEBUG_FILE
#
# ROOTFS (emptied first) receives:
#   /usr/local/bin/external-endpoints   BINARY without its debug info (symbols kept, so
#                                       profilers and backtraces still name functions), with a
#                                       .gnu_debuglink naming DEBUG_FILE's base name
#   every shared library `ldd` names    at the path ldd gives (the dynamic loader included)
#   /etc/passwd, /etc/group             root and nonroot (65532), the image's user
#   /etc/ssl/certs/ca-certificates.crt  for an API server whose kubeconfig names no CA (the
#                                       in-cluster config always does)
# DEBUG_FILE receives the debug info (`objcopy --only-keep-debug`), for profiling; it is not
# part of the image.
# Prints the image's files, one a line, sorted.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 BINARY ROOTFS DEBUG_FILE" >&2
  exit 2
fi
binary=$1 rootfs=$2 debug=$3
for tool in objcopy ldd; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is needed (binutils, libc-bin)" >&2; exit 1; }
done
certs=/etc/ssl/certs/ca-certificates.crt
[[ -f $certs ]] || { echo "$0: $certs is missing (package ca-certificates)" >&2; exit 1; }

rm -rf "$rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$(dirname "$debug")"

objcopy --only-keep-debug "$binary" "$debug"
# --add-gnu-debuglink reads the debug file, by the name it records: run it beside that file.
stripped=$(mktemp)
trap 'rm -f "$stripped"' EXIT
objcopy --strip-debug "$binary" "$stripped"
(cd "$(dirname "$debug")" && objcopy --add-gnu-debuglink="$(basename "$debug")" "$stripped")
install -m 0755 "$stripped" "$rootfs/usr/local/bin/external-endpoints"

# `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and `/lib64/ld-linux-x86-64.so.2 (0x...)`
# name files; `linux-vdso.so.1 (0x...)` is the kernel's.
ldd "$binary" | grep -o '/[^ ]*' | sort -u | while read -r library; do
  real=$(readlink -f "$library")
  mkdir -p "$rootfs$(dirname "$library")"
  install -m "$(stat -c %a "$real")" "$real" "$rootfs$library"
done

cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"
install -m 0644 "$certs" "$rootfs$certs"

(cd "$rootfs" && find . -type f | sed 's|^\.||' | LC_ALL=C sort)
