#!/usr/bin/env bash
# Reads the probe's audit log (Lease and EndpointSlice writes) and reports slice writes made by a
# pod that did not hold the Lease at that moment (by the Lease writes before it, in the order the
# API server finished them), and slice writes the API server denied.
# usage: audit-check.sh AUDIT_LOG [LEASE_NAME] [SERVICE_ACCOUNT_USER]
# Exit 1 when a successful slice write came from a non-holder.
set -euo pipefail
log=$1 lease=${2:-external-endpoints-write}
user=${3:-system:serviceaccount:external-endpoints:external-endpoints}
jq -rs --arg lease "$lease" --arg user "$user" '
  [ .[] | select(.stage == "ResponseComplete")
    | {t: .stageTimestamp, code: (.responseStatus.code // 0), res: .objectRef.resource,
       name: .objectRef.name, verb, who: .user.username,
       pod: ((.user.extra // {})["authentication.kubernetes.io/pod-name"] // [""])[0],
       holder: (.requestObject.spec.holderIdentity // null)} ]
  | sort_by(.t)
  | reduce .[] as $e ({holder: null, ok: 0, bad: [], denied: 0, leases: 0, holders: []};
      if $e.res == "leases" and $e.name == $lease and $e.code < 300 and $e.holder != null then
        .leases += 1
        | (if $e.holder != .holder then .holders += [$e.t + " " + $e.holder] else . end)
        | .holder = $e.holder
      elif $e.res == "endpointslices" and $e.who == $user then
        if $e.code >= 300 then .denied += 1
        elif $e.pod == .holder then .ok += 1
        else .bad += [$e.t + " " + $e.verb + " " + ($e.name // "") + " by " + $e.pod + " while " + (.holder // "nobody") + " held"] end
      else . end)
  | "lease writes: \(.leases); holders in turn:\n  \(.holders | join("\n  "))\nslice writes by the holder: \(.ok); denied: \(.denied); by a non-holder: \(.bad | length)\n  \(.bad[:20] | join("\n  "))"
' "$log"
n=$(jq -rs --arg lease "$lease" --arg user "$user" '
  [ .[] | select(.stage == "ResponseComplete") ] | sort_by(.stageTimestamp)
  | reduce .[] as $e ({h: null, bad: 0};
      if $e.objectRef.resource == "leases" and $e.objectRef.name == $lease and ($e.responseStatus.code // 0) < 300 and ($e.requestObject.spec.holderIdentity // null) != null then .h = $e.requestObject.spec.holderIdentity
      elif $e.objectRef.resource == "endpointslices" and $e.user.username == $user and ($e.responseStatus.code // 0) < 300
           and (((($e.user.extra // {})["authentication.kubernetes.io/pod-name"] // [""])[0]) != .h) then .bad += 1
      else . end) | .bad' "$log")
[[ "$n" == 0 ]]
