#!/usr/bin/env bash
# A local playground: a real kube-apiserver + etcd on 127.0.0.1 (the testbed) with the CRD,
# sample Services and ExternalWorkloads, and two controller replicas competing for the Lease.
# Ctrl-C stops everything: the replicas first (they drain and release the Lease), then the
# control plane, which removes its files.
#
# Environment:
#   PLAYGROUND_DIR      folder for the kubeconfig and logs (default: a new folder under /tmp)
#   PLAYGROUND_PROFILE  cargo profile of the binaries: dev (default) or release
#   PLAYGROUND_ADMIN_A  admin address of replica playground-a (default 127.0.0.1:9990)
#   PLAYGROUND_ADMIN_B  admin address of replica playground-b (default 127.0.0.1:9991)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

profile="${PLAYGROUND_PROFILE:-dev}"
admin_a="${PLAYGROUND_ADMIN_A:-127.0.0.1:9990}"
admin_b="${PLAYGROUND_ADMIN_B:-127.0.0.1:9991}"
dir="${PLAYGROUND_DIR:-$(mktemp -d /tmp/external-endpoints-playground.XXXXXX)}"
mkdir -p "$dir"
kubeconfig="$dir/kubeconfig"
lease_namespace=external-endpoints
lease_name=external-endpoints-write
demo=demo

say() { printf '[playground] %s\n' "$*" >&2; }

# --- stop everything, once, whatever the way out ----------------------------------------------

control_plane_pid=""
replica_pids=()
replica_logs=()
stopping=0

# Waits up to $2 seconds for process $1 to exit.
wait_gone() {
  local pid=$1 seconds=$2 i
  for ((i = 0; i < seconds * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}

stop() {
  local pid
  ((stopping)) && return
  stopping=1
  trap - INT TERM
  # Replicas first, while the API server is still there for the drain and the Lease release.
  for pid in "${replica_pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${replica_pids[@]}"; do
    if ! wait_gone "$pid" 20; then
      say "replica $pid did not stop in 20s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n "$control_plane_pid" ]]; then
    kill -TERM "$control_plane_pid" 2>/dev/null || true
    if ! wait_gone "$control_plane_pid" 30; then
      say "control plane did not stop in 30s; killing it"
      kill -KILL "$control_plane_pid" 2>/dev/null || true
    fi
    wait "$control_plane_pid" 2>/dev/null || true
  fi
  say "stopped; logs kept in $dir"
}

trap 'say "interrupted: stopping"; stop; exit 130' INT
trap 'say "terminated: stopping"; stop; exit 143' TERM
trap 'stop' EXIT

# --- build --------------------------------------------------------------------------------------

say "building the testbed binaries if needed (testbed/build.sh; the first build takes a while)"
testbed_bin="$(bash testbed/build.sh | tail -n 1)"
kubectl_bin="$testbed_bin/kubectl"
if [[ ! -x "$kubectl_bin" ]]; then
  kubectl_bin="$(command -v kubectl || true)"
  [[ -n "$kubectl_bin" ]] || { say "no kubectl: run testbed/build.sh without TESTBED_SKIP_KUBECTL"; exit 1; }
fi

say "building the controller and the control-plane command (profile $profile)"
cargo build --profile "$profile" -p external-endpoints -p testbed --bins
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
case "$profile" in
  dev) bin_dir="$target_dir/debug" ;;
  *) bin_dir="$target_dir/$profile" ;;
esac

kubectl() { "$kubectl_bin" --kubeconfig "$kubeconfig" "$@"; }

# --- control plane ------------------------------------------------------------------------------

# Every child gets its own session (setsid): a Ctrl-C in the terminal reaches only this script,
# which then stops the children in order.
rm -f "$kubeconfig"
setsid "$bin_dir/control-plane" --write-kubeconfig "$kubeconfig" >"$dir/control-plane.log" 2>&1 &
control_plane_pid=$!
say "starting the control plane (log $dir/control-plane.log)"
deadline=$((SECONDS + 180))
while true; do
  if ! kill -0 "$control_plane_pid" 2>/dev/null; then
    say "the control plane exited; its log:"
    cat "$dir/control-plane.log" >&2
    exit 1
  fi
  if [[ -s "$kubeconfig" ]] && kubectl get --raw /readyz >/dev/null 2>&1; then
    break
  fi
  if ((SECONDS > deadline)); then
    say "the control plane was not ready within 180s"
    exit 1
  fi
  sleep 0.1
done
say "control plane ready: $(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')"

# --- sample objects -----------------------------------------------------------------------------

kubectl apply -f deploy/namespace.yaml >/dev/null
kubectl create namespace "$demo" >/dev/null

# Two Services: `web` targets the workloads' port *named* http; `api` a numeric port.
kubectl apply -n "$demo" -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Service
metadata:
  name: web
  labels: {team: payments}
spec:
  selector: {app: web}
  ports:
    - {name: http, port: 80, targetPort: http}
---
apiVersion: v1
kind: Service
metadata:
  name: api
spec:
  # Both families where the cluster has both (the playground does): one slice per family.
  ipFamilyPolicy: PreferDualStack
  selector: {app: api}
  ports:
    - {name: grpc, port: 9000, targetPort: 9000}
EOF

# workload NAME APP IP ZONE READY [PORT_NAME PORT]
workload() {
  local name=$1 app=$2 ip=$3 zone=$4 ready=$5 port_name=${6:-} port=${7:-}
  local ports=""
  [[ -n "$port" ]] && ports="  ports: [{name: $port_name, port: $port}]"
  kubectl apply -n "$demo" -f - >/dev/null <<EOF
apiVersion: workload.linkerd.io/v1beta1
kind: ExternalWorkload
metadata:
  name: $name
  labels: {app: $app, topology.kubernetes.io/zone: $zone}
spec:
  meshTLS:
    identity: $name.$demo.serviceaccount.identity.linkerd.cluster.local
    serverName: $name.$demo.cluster.local
  workloadIPs: [{ip: "$ip"}]
$ports
EOF
  local now
  now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  kubectl patch -n "$demo" externalworkload "$name" --subresource=status --type=merge \
    -p "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"$ready\",\"lastTransitionTime\":\"$now\",\"reason\":\"Playground\",\"message\":\"set by playground.sh\"}]}}" \
    >/dev/null
}
workload web-vm-1 web 10.1.0.1 zone-a True http 8080
workload web-vm-2 web 10.1.0.2 zone-b True http 8080
workload web-vm-3 web 10.1.0.3 zone-a False http 8080
workload api-vm-1 api 10.2.0.1 zone-a True
workload api-vm-2 api fd00:10:2::2 zone-b False
say "created Services web, api and 5 ExternalWorkloads in namespace $demo"

# --- two replicas -------------------------------------------------------------------------------

start_replica() {
  local identity=$1 admin=$2
  setsid "$bin_dir/external-endpoints" \
    --kubeconfig "$kubeconfig" \
    --identity "$identity" \
    --lease-namespace "$lease_namespace" --lease-name "$lease_name" \
    --admin-addr "$admin" \
    --drain-timeout 5s \
    >"$dir/$identity.log" 2>&1 &
  replica_pids+=($!)
  replica_logs+=("$dir/$identity.log")
}
start_replica playground-a "$admin_a"
start_replica playground-b "$admin_b"

# web: one IPv4 slice; api: one IPv4 and one IPv6 slice.
deadline=$((SECONDS + 30))
while true; do
  for index in 0 1; do
    if ! kill -0 "${replica_pids[$index]}" 2>/dev/null; then
      say "a replica exited at start-up (admin port in use? set PLAYGROUND_ADMIN_A/B):"
      tail -n 20 "${replica_logs[$index]}" >&2
      exit 1
    fi
  done
  slices="$(kubectl get endpointslices -n "$demo" -o name \
    -l endpointslice.kubernetes.io/managed-by=linkerd-external-workloads-controller | wc -l)"
  ((slices >= 3)) && break
  if ((SECONDS > deadline)); then
    say "only $slices of 3 slices after 30s; see $dir/playground-a.log and $dir/playground-b.log"
    break
  fi
  sleep 0.2
done

cat <<EOF

Playground running ($slices EndpointSlices in namespace $demo).
  replicas:  playground-a (admin http://$admin_a)   log $dir/playground-a.log
             playground-b (admin http://$admin_b)   log $dir/playground-b.log
  control plane log: $dir/control-plane.log

Try:
  export KUBECONFIG=$kubeconfig
  alias kubectl=$kubectl_bin
  kubectl get endpointslices -n $demo -L kubernetes.io/service-name -w
  kubectl get externalworkloads -n $demo -o wide
  kubectl get lease -n $lease_namespace $lease_name -w \\
    -o custom-columns=HOLDER:.spec.holderIdentity,TRANSITIONS:.spec.leaseTransitions,RENEWED:.spec.renewTime
  kubectl get events -n $demo
  curl -s http://$admin_a/metrics | grep '^external_endpoints_leader'
  curl -s http://$admin_b/ready
  kubectl patch -n $demo externalworkload web-vm-3 --subresource=status --type=merge \\
    -p '{"status":{"conditions":[{"type":"Ready","status":"True"}]}}'
  kill -TERM ${replica_pids[0]}   # stop playground-a: playground-b takes over at once if a led

Ctrl-C stops everything.
EOF

# Wait for Ctrl-C (the traps), or for a child to die on its own.
while true; do
  # A replica may be stopped by hand (to watch a hand-over); the control plane may not.
  if ! kill -0 "$control_plane_pid" 2>/dev/null; then
    say "the control plane exited; stopping"
    exit 1
  fi
  sleep 1 &
  wait $! || true
done
