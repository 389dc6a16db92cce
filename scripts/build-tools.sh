#!/usr/bin/env bash
# Builds the operator-tooling binaries the tests use (helm, promtool, prometheus) from Go modules into
# ~/.cache/external-endpoints/<tool>-<version>, once. Prints each binary's path.
#   scripts/build-tools.sh            # every tool
#   scripts/build-tools.sh helm       # one tool
#
# Measured on a 2-core machine shared with other builds (Go 1.26, empty module cache for helm):
# cold helm 193 s, promtool 559 s, prometheus 128 s (after promtool: modules and packages
# cached); warm (all present) under 0.1 s.
set -euo pipefail

HELM_VERSION=v3.21.4
PROMETHEUS_VERSION=v0.316.0

export GOTOOLCHAIN=local
export CGO_ENABLED=0
cache="${EXTERNAL_ENDPOINTS_CACHE:-$HOME/.cache/external-endpoints}"

log() { printf '[scripts/build-tools.sh] %s\n' "$*" >&2; }

build() { # <name> <version> <package>
  local name=$1 version=$2 pkg=$3
  local out="$cache/$name-${version#v}"
  if [[ -x "$out/$name" ]]; then
    log "$name present in $out"
  else
    command -v go >/dev/null || { log "go is not installed"; exit 1; }
    mkdir -p "$out"
    local t0; t0=$(date +%s)
    log "building $name $version ($pkg) ..."
    GOBIN="$out" nice -n 10 go install -trimpath "$pkg@$version"
    log "built $name in $(( $(date +%s) - t0 ))s"
  fi
  echo "$out/$name"
}

tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=(helm promtool prometheus)
for tool in "${tools[@]}"; do
  case "$tool" in
    helm) build helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
    promtool) build promtool "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool ;;
    # Without the web UI's assets (not needed: the tests use the HTTP API only).
    prometheus) build prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus ;;
    *) log "unknown tool $tool"; exit 2 ;;
  esac
done
