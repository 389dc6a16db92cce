# Go build steps shared by testbed/build.sh and testbed/node/build.sh; sourced, not run.
# The caller sets `log` (its own prefix) and exports GOTOOLCHAIN, CGO_ENABLED and GOFLAGS.
# shellcheck shell=bash

# Builds <package> of the module in <module dir> into <output path>, unless it is there.
# Written to a temporary name, then renamed: an interrupted build never leaves a truncated
# binary that a later run would take for a finished one. GO_BUILD_NICE=1 builds under nice 19.
go_build() { # <module dir> <package> <output path> <ldflags> [tags]
  local dir=$1 pkg=$2 dest=$3 ldflags=$4 tags=${5:-} name
  name=$(basename "$dest")
  if [[ -x "$dest" ]]; then log "$name present"; return; fi
  log "building $name ($pkg) ..."
  local t0 nice=()
  t0=$(date +%s)
  [[ "${GO_BUILD_NICE:-}" == 1 ]] && nice=(nice -n 19)
  (cd "$dir" && "${nice[@]}" go build -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags" \
    -o "$dest.tmp" "$pkg")
  mv -f "$dest.tmp" "$dest"
  log "built $name in $(( $(date +%s) - t0 ))s"
}

module_field() { # <module@version> <json field>
  go mod download -json "$1" | jq -r ".$2 // empty"
}

# The -ldflags of a kubernetes command at $K8S_VERSION: stripped, and stamped with the version,
# the commit (empty when the proxy does not record it: /version then shows no gitCommit) and
# the release's publication time, not now, so that rebuilding gives the same binary.
kubernetes_ldflags() {
  local commit minor build_date ld="-s -w" pkg
  commit=$(module_field "k8s.io/kubernetes@$K8S_VERSION" Origin.Hash)
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  build_date=$(jq -r '.Time // empty' "$(module_field "k8s.io/kubernetes@$K8S_VERSION" Info)")
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  echo "$ld"
}
