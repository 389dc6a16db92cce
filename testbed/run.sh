#!/usr/bin/env bash
# Starts a local control plane (etcd + kube-apiserver, the project's CRDs installed) and keeps
# it running until Ctrl-C. Builds the binaries first if they are not cached yet.
#   testbed/run.sh [--write-kubeconfig PATH]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/build.sh" >/dev/null
cd "$here/.."
exec cargo run --quiet -p testbed --bin control-plane -- "$@"
