#!/usr/bin/env bash
# Builds the packaged `leadership` crate as an outside crate would: `cargo package` (with
# `kube-watch-loop`, which it depends on and which is published beside it), unpack the .crates,
# then build a crate of its own in a temporary folder, outside this workspace, whose dependency
# lines are the README's (with `leadership` pointing at the unpacked package, and crates.io's
# `kube-watch-loop` patched to its unpacked package), whose main.rs is the README's example, and
# whose examples are the package's own examples. So the README's lines and example, and the
# examples, are shown to work with what crates.io would get.
#
# Offline: versions come from this workspace's Cargo.lock and the local registry cache (warm
# once the workspace has been built). The outside crate's target folder is kept outside the
# clone, keyed by toolchain (like the release and simulation builds), so a warm run only
# rebuilds the package and the crate.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
toolchain=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
outside_target=${EXTERNAL_ENDPOINTS_PACKAGED_TARGET:-$HOME/.cache/external-endpoints/packaged-target/rust-$toolchain}
readme=crates/leadership/README.md

# A code block of the README: the first one opened by the fence line $1.
block() {
  awk -v fence="$1" '
    $0 == fence && !done { inside = 1; next }
    inside && /^```$/ { inside = 0; done = 1; next }
    inside { print }
  ' "$readme"
}

echo "==> cargo package -p kube-watch-loop -p leadership"
# As libraries they enable no Kubernetes version; the packages' own check builds need one.
K8S_OPENAPI_ENABLED_VERSION=1.37 cargo package -p kube-watch-loop -p leadership --locked --allow-dirty --no-verify --quiet
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$target/package/leadership-$version.crate" -C "$work"
tar -xzf "$target/package/kube-watch-loop-$version.crate" -C "$work"
package="$work/leadership-$version"
watch_loop="$work/kube-watch-loop-$version"
adopter="$work/adopter"
mkdir -p "$adopter/src" "$adopter/examples"

dependencies=$(block '```toml')
grep -q '^leadership = "' <<<"$dependencies" || {
  echo "the README's dependency lines name no leadership version" >&2
  exit 1
}
{
  cat <<EOF
[package]
name = "adopter"
version = "0.0.0"
edition = "2024"
publish = false

EOF
  sed "s|^leadership = \".*\"|leadership = { path = \"$package\" }|" <<<"$dependencies"
  # What the package's examples use besides the README's lines (their CLI, output and errors).
  cat <<'EOF'

[dev-dependencies]
anyhow = "1"
clap = { version = "4", features = ["derive"] }
humantime = "2"
parking_lot = "0.12"
serde_json = "1"
thiserror = "2"
tracing = "0.1"
tracing-subscriber = { version = "0.3", features = ["env-filter"] }
EOF
  # Not on crates.io until it is published with leadership: its package stands in.
  printf '\n[patch.crates-io]\nkube-watch-loop = { path = "%s" }\n' "$watch_loop"
} >"$adopter/Cargo.toml"
block '```rust,no_run' >"$adopter/src/main.rs"
[[ -s "$adopter/src/main.rs" ]] || {
  echo "the README has no example" >&2
  exit 1
}
cp "$package"/examples/*.rs "$adopter/examples/"
# The workspace's versions and toolchain, as a team that copied them would have.
cp Cargo.lock rust-toolchain.toml "$adopter/"

echo "==> building an outside crate on the package: README example + $(ls "$adopter/examples" | tr '\n' ' ')"
(cd "$adopter" && CARGO_TARGET_DIR="$outside_target" cargo build --offline --quiet --bins --examples)
echo "packaged crate builds as an outside crate"
