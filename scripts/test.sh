#!/usr/bin/env bash
# The whole test suite: formatting, lints, docs, unit tests, and the integration and end-to-end
# tests against a real kube-apiserver + etcd (built by testbed/build.sh; see docs/testbed.md).
# Without the testbed binaries, integration tests print how to enable them and pass, unless
# CI=true, where they fail.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

# The one crate meant for crates.io: packaged and built alone, as `cargo publish` would (it
# reaches the crates.io index; nothing is uploaded).
echo "==> cargo publish --dry-run -p leadership"
cargo publish --dry-run -p leadership --locked

echo "==> cargo test"
cargo test --workspace --locked "$@"
