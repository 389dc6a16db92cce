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

# The mutants of the guard files must be the ones recorded after the last mutation run
# (docs/mutation.md): guard code changed without a run shows up here. About a second, plus
# installing cargo-mutants into the tool cache the first time (about two minutes).
echo "==> scripts/mutants.sh check"
bash scripts/mutants.sh check

echo "==> cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

# The crates meant for crates.io, `leadership` and the watch loop it runs its Lease watch on
# (`kube-watch-loop`, published with it): packaged and built alone, as `cargo publish` would (it
# reaches the crates.io index; nothing is uploaded). Named together, cargo verifies leadership
# against the packaged watch loop, as crates.io would serve it once both are published. As
# libraries they enable no Kubernetes version of k8s-openapi (the application chooses); built
# alone they take the workspace's from K8S_OPENAPI_ENABLED_VERSION, set for this command only
# (set in .cargo/config.toml instead, cargo saw it as changed on every build and rebuilt the kube
# stack each time).
echo "==> cargo publish --dry-run -p kube-watch-loop -p leadership"
K8S_OPENAPI_ENABLED_VERSION=1.37 cargo publish --dry-run -p kube-watch-loop -p leadership --locked

# The package again, built as an outside crate would use it: the README's dependency lines and
# example, and the package's examples (offline, from the registry cache the build above warmed).
echo "==> scripts/packaged.sh"
bash scripts/packaged.sh

echo "==> cargo test"
cargo test --workspace --locked --exclude sim "$@"

# The simulation runs thousands of seeds, so it is built with optimisations, and with
# `--cfg tokio_unstable` so that it can seed tokio's own choices (a seed then replays exactly).
# Its target folder is kept outside the clone, keyed by toolchain, so its dependencies stay warm.
echo "==> the simulation (cargo test --release -p sim)"
toolchain=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
RUSTFLAGS="--cfg tokio_unstable" \
  CARGO_TARGET_DIR="${EXTERNAL_ENDPOINTS_SIM_TARGET:-$HOME/.cache/external-endpoints/sim-target/rust-$toolchain}" \
  cargo test --release --locked -p sim -- --nocapture
