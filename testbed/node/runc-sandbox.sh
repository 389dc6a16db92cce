#!/usr/bin/env bash
# containerd's runc (BinaryName in the probe's containerd config): runc from Debian, with two
# narrow changes to the OCI spec that this sandbox requires, made to the bundle's config.json
# before `runc create`/`runc run`:
#   - process.oomScoreAdj is raised to the caller's own score when lower. The sandbox refuses a
#     lower score to root: write(/proc/self/oom_score_adj, "-997") -> EACCES, and runc fails with
#     "nsexec: failed to update /proc/self/oom_score_adj: Permission denied". The kubelet asks for
#     -998 (pod sandboxes) and -997 (Guaranteed pods).
#   - process.rlimits is dropped: the sandbox refuses setrlimit to containers (CRI already sends
#     none; this covers specs built elsewhere).
# Every other call goes to runc unchanged.
set -euo pipefail
runc=${EE36_RUNC:-/usr/sbin/runc}
bundle=""
args=("$@")
sub=""
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    create | run) [[ -z "$sub" ]] && sub=${args[i]} ;;
    --bundle | -b) bundle=${args[i + 1]:-} ;;
    --bundle=*) bundle=${args[i]#--bundle=} ;;
  esac
done
if [[ -n "$sub" ]]; then
  cfg="${bundle:-.}/config.json"
  if [[ -f "$cfg" ]]; then
    own=$(cat /proc/self/oom_score_adj)
    jq --argjson own "$own" '
      if (.process.oomScoreAdj // $own) < $own then .process.oomScoreAdj = $own else . end
      | del(.process.rlimits)' "$cfg" >"$cfg.ee36" && mv "$cfg.ee36" "$cfg"
  fi
fi
exec "$runc" "$@"
