#!/usr/bin/env bash
# A small real cluster for issue 36, in namespaces of its own: the testbed's etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler on a bridge in a network namespace,
# and NODES nodes (containerd 2.x, kubelet, kube-proxy, CNI bridge; node.sh), each in a network
# and mount namespace of its own; everything in one PID namespace, so that nothing (containerd
# shims included) and no mount outlives the run. docs/testbed.md describes it.
#
# usage: sudo [NODES=2] [PROBE_STAGE=chart] testbed/node/probe.sh [--keep]
#   default      NODES nodes (default 1) Ready, and a pod scheduled, started and Succeeded
#   chart        then the Helm chart with its defaults (two replicas Ready), sample workloads,
#                `external-endpoints check`, leadership moved by rollout restart, drain of the
#                leader's node and SIGKILL of its container while workloads are added (no change
#                lost), a deposed leader's write with its projected token (denied by the fencing
#                policy), and the audit log checked for slice writes by a non-holder
# Needs root, the binaries of testbed/build.sh (TESTBED_BUILD_KCM=1) and testbed/node/build.sh
# (it does not build them: exit 2 when absent), runc, iptables, openssl, jq, util-linux, go; for
# chart: scripts/image.sh's OCI layout (EE_IMAGE_OCI, default target/image/oci), the release
# binary (EE_BIN, default target/release/external-endpoints), helm (HELM, default
# ~/.cache/external-endpoints/helm-*/helm, scripts/build-tools.sh).
# Writes everything to a temporary folder /tmp/ee36-probe.*, removed afterwards unless --keep or
# the run failed (every component's log and the audit log are in it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../versions.env"; . "$here/versions.env"

if [[ "${1:-}" != --inner ]]; then
  skip() { echo "probe: not run: $*" >&2; exit 2; }
  [[ $(id -u) == 0 ]] || skip "needs root (network, PID and mount namespaces, cgroups)"
  tb=${TB:-${EXTERNAL_ENDPOINTS_TESTBED_CACHE:-$HOME/.cache/external-endpoints/testbed}/${K8S_VERSION#v}-etcd${ETCD_VERSION#v}}
  nb=${NB:-${EXTERNAL_ENDPOINTS_NODE_CACHE:-$HOME/.cache/external-endpoints/node}/${K8S_VERSION#v}-containerd${CONTAINERD_VERSION#v}-cni${CNI_PLUGINS_VERSION#v}}
  for b in etcd kube-apiserver kubectl kube-controller-manager; do
    [[ -x "$tb/$b" ]] || skip "no $tb/$b (TESTBED_BUILD_KCM=1 testbed/build.sh)"
  done
  for b in kubelet kube-scheduler kube-proxy containerd containerd-shim-runc-v2 ctr cni/bridge cni/host-local cni/loopback cni/portmap; do
    [[ -x "$nb/$b" ]] || skip "no $nb/$b (testbed/node/build.sh)"
  done
  for c in runc iptables openssl jq unshare nsenter ip go curl; do command -v $c >/dev/null || skip "$c missing"; done
  # Written for this kernel's cgroup v1 hierarchies (per-node cgroup roots in each of them).
  [[ -d /sys/fs/cgroup/memory ]] || skip "no cgroup v1 memory hierarchy: cgroup v2 hosts are not handled yet"
  D=$(mktemp -d /tmp/ee36-probe.XXXXXX)
  if [[ "${PROBE_STAGE:-}" == chart ]]; then
    # The image scripts/image.sh built (an OCI layout), as an archive for `ctr images import`.
    oci=${EE_IMAGE_OCI:-$here/../../target/image/oci}
    [[ -f "$oci/index.json" ]] || { rm -rf "$D"; skip "no image at $oci (scripts/image.sh)"; }
    tar -C "$oci" -cf "$D/ee-image.tar" .
    export EE_IMAGE_TAR=$D/ee-image.tar
    EE_BIN=${EE_BIN:-$here/../../target/release/external-endpoints}
    HELM=${HELM:-$(ls -d "$HOME"/.cache/external-endpoints/helm-*/helm 2>/dev/null | tail -n1)}
    [[ -x "$EE_BIN" ]] || { rm -rf "$D"; skip "no $EE_BIN (cargo build --release -p external-endpoints)"; }
    [[ -x "$HELM" ]] || { rm -rf "$D"; skip "no helm (scripts/build-tools.sh)"; }
  fi
  NS=ee36-$$; created=()
  echo "probe: folder $D, network namespace $NS" >&2
  ip netns add "$NS"
  CG=ee36-$$   # the kubelet's --cgroup-root, in every cgroup v1 hierarchy
  cleanup() {
    ip netns del "$NS" 2>/dev/null || true
    # Cgroups outlive their processes: remove the tree, deepest first; and the empty folders
    # made for the private mounts. Retried: the PID namespace's processes may take a moment to go.
    local try d
    for try in 1 2 3 4 5 6 7 8 9 10; do
      for d in "${created[@]}"; do rmdir "$d" 2>/dev/null || true; done
      find /sys/fs/cgroup/*/"$CG" -depth -type d -exec rmdir {} + 2>/dev/null || true
      compgen -G "/sys/fs/cgroup/*/$CG" >/dev/null || break
      sleep 0.5
    done
    [[ "${KEEP:-}" == 1 ]] || rm -rf "$D"
  }
  [[ "${1:-}" == --keep ]] && KEEP=1
  trap cleanup EXIT
  trap 'exit 143' TERM INT   # so that cleanup runs on a timeout too
  rc=0
  PRIVATE_DIRS="/var/lib/kubelet /var/lib/cni /var/log/pods /var/log/containers"
  created=()
  for d in $PRIVATE_DIRS; do [[ -e $d ]] || { mkdir -p "$d"; created+=("$d"); }; done
  # `ip netns exec` mounts a fresh /sys, without /sys/fs/cgroup: the inner script mounts these again.
  cgmounts=$(awk '$3 == "cgroup" || $3 == "cgroup2" {print $2, $3, $4}' /proc/mounts)
  # PID namespace: when the inner script (its PID 1) exits, the kernel kills every process left
  # in it, shims included. Mount namespace: every mount made inside goes with it.
  ip netns exec "$NS" unshare --pid --fork --kill-child --mount --propagation private --mount-proc \
    env PROBE_STAGE="${PROBE_STAGE:-}" NODES="${NODES:-1}" EE_IMAGE_TAR="${EE_IMAGE_TAR:-}" \
    EE_BIN="${EE_BIN:-}" HELM="${HELM:-}" REPO="$here/../.." TB="$tb" NB="$nb" D="$D" CG="$CG" CGMOUNTS="$cgmounts" PRIVATE_DIRS="$PRIVATE_DIRS" "$0" --inner || rc=$?
  [[ $rc == 0 ]] || { KEEP=1; echo "probe: failed ($rc); logs in $D/*.log" >&2; }
  exit $rc
fi

# ------------------------------------------------------------------ inside the namespaces
HERE=$here
exec 3>&2   # the run's stderr, for messages from inside wait_for's silenced checks
mount --make-rshared /
mount -t tmpfs tmpfs /run   # /run/netns, /run/containerd: private to the probe
# Paths the kubelet, containerd and libcni use whatever their configuration says
# (/var/lib/kubelet/device-plugins, /var/lib/cni/results, /var/log/pods and /var/log/containers):
# a private tmpfs over each (the outer script removes the empty folders it had to create).
for d in $PRIVATE_DIRS; do mount -t tmpfs tmpfs "$d"; done
export HOME=$D/home; mkdir -p "$HOME"   # kubectl's discovery cache
mkdir -p /run/netns
ip link set lo up
ip link add eebr0 type bridge
ip addr add 10.77.0.1/24 dev eebr0
ip link set eebr0 up
ip route add default dev eebr0 2>/dev/null || true
IP=10.77.0.1
if [[ ! -e /sys/fs/cgroup/memory ]]; then
  mount -t tmpfs -o mode=755 cgroup-root /sys/fs/cgroup
  while read -r dir type opts; do
    mkdir -p "$dir"; mount -t "$type" -o "$opts" "$type" "$dir"
  done <<<"$CGMOUNTS"
fi
# The kubelet's cgroup root must exist in every hierarchy; cpuset needs its cpus and mems set.
for h in /sys/fs/cgroup/*/; do
  [[ -f "$h/cgroup.procs" ]] || continue
  mkdir -p "$h/$CG"
  if [[ -f "$h/cpuset.cpus" ]]; then
    cat "$h/cpuset.cpus" >"$h/$CG/cpuset.cpus"; cat "$h/cpuset.mems" >"$h/$CG/cpuset.mems"
  fi
done
log() { printf '[probe %s] %s\n' "$(date +%T)" "$*" >&2; }
pids=()
start() { # <name> <cmd...>
  local n=$1; shift
  "$@" >"$D/$n.log" 2>&1 &
  pids+=($!); log "started $n (pid $!)"
}
wait_for() { # <what> <seconds> <cmd...>
  local what=$1 t=$2; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || { log "timeout waiting for $what"; return 1; }
    sleep 1
  done
  log "$what: ok after $((SECONDS))s"
}

# ---------------------------------------------------------------- certificates
P=$D/pki; mkdir -p "$P"; cd "$P"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=ee36-ca 2>/dev/null
cert() { # <name> <subject> [sans]
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  # v3 extensions always: rustls (the controller's `check`) refuses v1 certificates.
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$1.ext"
  [[ -z "${3:-}" ]] || printf 'subjectAltName=%s\n' "$3" >>"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 2 \
    -extfile "$1.ext" 2>/dev/null
}
cert apiserver /CN=kube-apiserver "IP:$IP,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
cert admin "/O=system:masters/CN=admin"
cert proxy /CN=system:kube-proxy
openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
kubeconfig() { # <user> -> file
  cat >"$D/$1.kubeconfig" <<EOK
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://$IP:6443", certificate-authority: "$P/ca.crt"}}]
users: [{name: u, user: {client-certificate: "$P/$1.crt", client-key: "$P/$1.key"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
EOK
}
kubeconfig admin; kubeconfig proxy
export KUBECONFIG=$D/admin.kubeconfig
k() { "$TB/kubectl" "$@"; }

# ---------------------------------------------------------------- control plane
start etcd "$TB/etcd" --name=t --data-dir="$D/etcd" --listen-client-urls=http://127.0.0.1:2379 \
  --advertise-client-urls=http://127.0.0.1:2379 --listen-peer-urls=http://127.0.0.1:2380 \
  --initial-advertise-peer-urls=http://127.0.0.1:2380 --initial-cluster=t=http://127.0.0.1:2380 \
  --listen-metrics-urls=http://127.0.0.1:0 --unsafe-no-fsync=true
# Audit: every write of a Lease or an EndpointSlice, with its request body (the Lease's holder)
# and the writer's user info (a projected token's pod name is in user.extra).
cat >"$D/audit-policy.yaml" <<EOA
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [create, update, patch, delete]
  resources: [{group: coordination.k8s.io, resources: [leases]}, {group: discovery.k8s.io, resources: [endpointslices]}]
- level: None
EOA
start kube-apiserver "$TB/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --audit-policy-file="$D/audit-policy.yaml" --audit-log-path="$D/audit.log" --audit-log-mode=blocking \
  --bind-address=$IP --advertise-address=$IP --secure-port=6443 \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" --authorization-mode=Node,RBAC \
  --service-cluster-ip-range=10.96.0.0/16 \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$P/sa.pub" \
  --service-account-signing-key-file="$P/sa.key" --allow-privileged=true \
  --kubelet-client-certificate="$P/admin.crt" --kubelet-client-key="$P/admin.key" \
  --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP
wait_for "apiserver readyz" 240 k get --raw /readyz
start kube-controller-manager "$TB/kube-controller-manager" --kubeconfig="$KUBECONFIG" \
  --bind-address=127.0.0.1 --leader-elect=false --service-account-private-key-file="$P/sa.key" \
  --root-ca-file="$P/ca.crt" --use-service-account-credentials=false \
  --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key"
start kube-scheduler "$NB/kube-scheduler" --kubeconfig="$KUBECONFIG" --bind-address=127.0.0.1 \
  --leader-elect=false

# ---------------------------------------------------------------- images, no registry
# An OCI image archive made by hand from a folder: one uncompressed layer.
mkimage() { # <name:tag> <rootfs> <out.tar> <entrypoint json>
  local name=$1 root=$2 out=$3 ep=$4 w; w=$(mktemp -d)
  mkdir -p "$w/blobs/sha256"
  tar -C "$root" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$w/layer.tar" .
  local ld ls cd cs md ms
  ld=$(sha256sum "$w/layer.tar" | cut -d' ' -f1); ls=$(stat -c %s "$w/layer.tar")
  mv "$w/layer.tar" "$w/blobs/sha256/$ld"
  jq -cn --arg d "sha256:$ld" --argjson ep "$ep" \
    '{architecture:"amd64",os:"linux",config:{Entrypoint:$ep},rootfs:{type:"layers",diff_ids:[$d]}}' >"$w/c"
  cd=$(sha256sum "$w/c" | cut -d' ' -f1); cs=$(stat -c %s "$w/c"); mv "$w/c" "$w/blobs/sha256/$cd"
  jq -cn --arg cd "sha256:$cd" --argjson cs "$cs" --arg ld "sha256:$ld" --argjson ls "$ls" \
    '{schemaVersion:2,mediaType:"application/vnd.oci.image.manifest.v1+json",
      config:{mediaType:"application/vnd.oci.image.config.v1+json",digest:$cd,size:$cs},
      layers:[{mediaType:"application/vnd.oci.image.layer.v1.tar",digest:$ld,size:$ls}]}' >"$w/m"
  md=$(sha256sum "$w/m" | cut -d' ' -f1); ms=$(stat -c %s "$w/m"); mv "$w/m" "$w/blobs/sha256/$md"
  jq -cn --arg md "sha256:$md" --argjson ms "$ms" --arg n "$name" --arg t "${name##*:}" \
    '{schemaVersion:2,manifests:[{mediaType:"application/vnd.oci.image.manifest.v1+json",digest:$md,size:$ms,
      annotations:{"io.containerd.image.name":$n,"org.opencontainers.image.ref.name":$t}}]}' >"$w/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci-layout"
  tar -C "$w" -cf "$out" oci-layout index.json blobs
  rm -rf "$w"
}
# pause: a static Go program that waits for a signal (the sandbox's PID 1); as `tool`, it prints
# its arguments and exits.
IMG=$D/images; mkdir -p "$IMG/pause-src" "$IMG/pause-root" "$IMG/tool-root"
cat >"$IMG/pause-src/main.go" <<'EOG'
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Println(os.Args[1:])
		return
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
EOG
printf 'module pause\n\ngo 1.24\n' >"$IMG/pause-src/go.mod"
(cd "$IMG/pause-src" && CGO_ENABLED=0 GOTOOLCHAIN=local nice -n 19 go build -trimpath -o "$IMG/pause-root/pause" .)
cp "$IMG/pause-root/pause" "$IMG/tool-root/tool"
mkimage registry.k8s.io/pause:3.10.1 "$IMG/pause-root" "$IMG/pause.tar" '["/pause"]'
mkimage docker.io/library/ee36-tool:1 "$IMG/tool-root" "$IMG/tool.tar" '["/tool"]'

NODES=${NODES:-1}
node_ip() { echo "10.77.0.$((10 + $1))"; }
nodes_ns() { echo "ee36n$1"; }
export PATH=$NB:$PATH   # containerd finds containerd-shim-runc-v2 on the PATH


for ((i = 1; i <= NODES; i++)); do
  cert node$i "/O=system:nodes/CN=system:node:node$i"
  cert serving-node$i /CN=node$i "IP:$(node_ip $i),DNS:node$i"
  kubeconfig node$i
done
k create clusterrolebinding ee36-proxy --clusterrole=system:node-proxier --user=system:kube-proxy >&2
# Nodes: a netns each, a veth to the bridge; pod CIDR 10.244.I.0/24 routed to node I.
for ((i = 1; i <= NODES; i++)); do
  ns=$(nodes_ns $i); nip=$(node_ip $i)
  ip netns add "$ns"
  ip link add "vn$i" type veth peer name eth0 netns "$ns"
  ip link set "vn$i" master eebr0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$nip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via $IP
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
  ip route add "10.244.$i.0/24" via "$nip"
  for ((j = 1; j <= NODES; j++)); do
    [[ $j == "$i" ]] || ip -n "$ns" route add "10.244.$j.0/24" via "$(node_ip $j)"
  done
done
for ((i = 1; i <= NODES; i++)); do
  # nsenter, not `ip netns exec`: the latter mounts a fresh /sys, without the cgroup mounts.
  start "node$i" nsenter --net=/run/netns/$(nodes_ns $i) unshare --mount --propagation private \
    env HERE="$HERE" TB="$TB" NB="$NB" D="$D" CG="$CG" PRIVATE_DIRS="$PRIVATE_DIRS" \
    P="$P" IMG="$IMG" EE_IMAGE_TAR="${EE_IMAGE_TAR:-}" "$HERE/node.sh" $i
  NODE_PID[$i]=$!   # node.sh itself (nsenter and unshare exec): its mount namespace is the node's
done
node_up() { # <i>: node I registered, failing at once when its node.sh ended
  kill -0 "${NODE_PID[$1]}" 2>/dev/null || { log "node$1 stopped: $(tail -n 3 "$D/node$1.log")" 2>&3; exit 1; }
  k get node "node$1"
}
for ((i = 1; i <= NODES; i++)); do
  wait_for "node$i registered" 180 node_up $i
  wait_for "node$i Ready" 180 k wait --for=condition=Ready node/node$i --timeout=1s
done
k get nodes -o wide >&2

# ---------------------------------------------------------------- a pod
cat <<EOP | k apply -f - >&2
apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - name: tool
    image: docker.io/library/ee36-tool:1
    imagePullPolicy: Never
    args: ["hello", "from", "a node"]
EOP
wait_for "default ServiceAccount" 60 k get sa default
wait_for "pod probe Succeeded" 120 bash -c "[[ \$($TB/kubectl get pod probe -o jsonpath={.status.phase}) == Succeeded ]]"
k logs probe >&2
k get pod probe -o wide >&2
log "PROBE OK"
[[ "${PROBE_STAGE:-}" == chart ]] || { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; exit 0; }

# ---------------------------------------------------------------- the chart, as an operator installs it
NSP=external-endpoints
t0=$SECONDS
"$HELM" install external-endpoints "$REPO/charts/external-endpoints" -n $NSP --create-namespace \
  --wait --timeout 5m >&2
log "helm install --wait: $((SECONDS - t0))s"
k -n $NSP get pods -o wide >&2
holder() { k -n $NSP get lease external-endpoints-write -o jsonpath='{.spec.holderIdentity}{" "}{.spec.leaseTransitions}'; }
until [[ -n "$(holder 2>/dev/null | cut -d' ' -f1)" ]]; do sleep 1; done
log "lease: $(holder)"

# Samples: a Service selecting ExternalWorkloads; workloads keep being added during every move.
k create namespace demo >&2
cat <<EOS | k apply -n demo -f - >&2
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
EOS
W=0
workload() { # adds workload number $1, Ready
  local n=$1 ip="10.1.$(($1 / 250)).$(($1 % 250 + 1))"
  k apply -n demo -f - >/dev/null <<EOW
apiVersion: workload.linkerd.io/v1beta1
kind: ExternalWorkload
metadata: {name: w$n, labels: {app: web}}
spec:
  meshTLS: {identity: w$n.demo.serviceaccount.identity.linkerd.cluster.local, serverName: w$n.demo.cluster.local}
  workloadIPs: [{ip: "$ip"}]
  ports: [{name: http, port: 8080}]
EOW
  k patch -n demo externalworkload w$n --subresource=status --type=merge -p \
    "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"lastTransitionTime\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\",\"reason\":\"Probe\",\"message\":\"probe\"}]}}" >/dev/null
}
# The churn: workloads created (and marked Ready) at a steady RATE per second (default 20) with
# curl and the admin certificate (kubectl's start-up alone takes longer than 1/20 s here).
api() { # <method> <path> <content type> <body>
  curl -sS --fail -o /dev/null --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" \
    -X "$1" -H "Content-Type: $3" --data-binary "$4" "https://$IP:6443$2"
}
workload_fast() {
  local n=$1 ip="10.1.$(($1 / 250)).$(($1 % 250 + 1))" base=/apis/workload.linkerd.io/v1beta1/namespaces/demo/externalworkloads
  api POST "$base" application/json \
    "{\"apiVersion\":\"workload.linkerd.io/v1beta1\",\"kind\":\"ExternalWorkload\",\"metadata\":{\"name\":\"w$n\",\"labels\":{\"app\":\"web\"}},\"spec\":{\"meshTLS\":{\"identity\":\"w$n.demo.serviceaccount.identity.linkerd.cluster.local\",\"serverName\":\"w$n.demo.cluster.local\"},\"workloadIPs\":[{\"ip\":\"$ip\"}],\"ports\":[{\"name\":\"http\",\"port\":8080}]}}"
  api PATCH "$base/w$n/status" application/merge-patch+json \
    "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"lastTransitionTime\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\",\"reason\":\"Probe\",\"message\":\"probe\"}]}}"
}
RATE=${RATE:-20}
churn_start() { # workloads added at RATE/s in the background until churn_stop
  CHURN_FIRST=$1
  CHURN_T0=$EPOCHREALTIME
  (
    n=$1 k0=$1 t0=${EPOCHREALTIME/./}
    while [[ ! -e $D/churn.stop ]]; do
      workload_fast $n; echo $n >"$D/churn.last"; n=$((n + 1))
      # the n-th workload is due at t0 + (n - k0) / RATE
      wait_us=$((t0 + (n - k0) * 1000000 / RATE - ${EPOCHREALTIME/./}))
      ((wait_us <= 0)) || sleep "$(printf '0.%06d' $((wait_us > 999999 ? 999999 : wait_us)))"
    done
  ) &
  CHURN=$!
}
churn_stop() { # sets LAST (not in $(...): only this shell can wait for the churn)
  touch "$D/churn.stop"; wait $CHURN; rm -f "$D/churn.stop"
  LAST=$(cat "$D/churn.last" 2>/dev/null || echo $((CHURN_FIRST - 1)))
}
slice_count() { k get endpointslices -n demo -l kubernetes.io/service-name=web -o json | jq '[.items[].endpoints // [] | .[] | select(.conditions.ready)] | length'; }
expect_all() { # <n workloads>: every one ends up in the slices (ready)
  local end=$((SECONDS + 120)) c
  while :; do
    c=$(slice_count)
    [[ "$c" == "$1" ]] && return 0
    ((SECONDS < end)) || { log "LOST: $c of $1 workloads in the slices"; return 1; }
    sleep 1
  done
}
for ((n = 0; n < 5; n++)); do workload $n; done
expect_all 5
log "slices published for 5 workloads"
KUBECONFIG=$D/admin.kubeconfig "$EE_BIN" check >&2 && log "external-endpoints check: PASS" || log "external-endpoints check: FAIL ($?)"

move() { # <name> <command...>: leadership moved while workloads are added
  local name=$1; shift
  local before; before=$(holder)
  rm -f "$D/churn.last"; churn_start $(($(k get externalworkloads -n demo -o name | wc -l)))
  local t0=$SECONDS
  "$@"
  churn_stop; local last=$LAST
  local rate; rate=$(awk -v n=$((LAST + 1 - CHURN_FIRST)) -v a="$CHURN_T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", n / (b - a) }')
  log "$name: done in $((SECONDS - t0))s; $((LAST + 1 - CHURN_FIRST)) workloads added meanwhile ($rate/s); lease before: $before; after: $(holder)"
  expect_all $((last + 1)) && log "$name: no change lost ($((last + 1)) workloads)"
}
rollout() { k -n $NSP rollout restart deploy/external-endpoints >&2; k -n $NSP rollout status deploy/external-endpoints --timeout=5m >&2; }
move "rollout restart" rollout
drain() {
  local leader node; leader=$(holder | cut -d' ' -f1)
  node=$(k -n $NSP get pod "$leader" -o jsonpath='{.spec.nodeName}')
  log "drain: leader $leader on $node"
  k drain "$node" --ignore-daemonsets --delete-emptydir-data --timeout=5m >&2
  k -n $NSP rollout status deploy/external-endpoints --timeout=5m >&2
  k uncordon "$node" >&2
}
move "drain" drain
sigkill() {
  local leader node cid i renew0
  leader=$(holder | cut -d' ' -f1)
  node=$(k -n $NSP get pod "$leader" -o jsonpath='{.spec.nodeName}')
  cid=$(k -n $NSP get pod "$leader" -o jsonpath='{.status.containerStatuses[0].containerID}'); cid=${cid#containerd://}
  i=${node#node}
  renew0=$(k -n $NSP get lease external-endpoints-write -o jsonpath='{.spec.renewTime}')
  log "sigkill: leader $leader on $node, container ${cid:0:12}, lease renewed $renew0"
  local t0; t0=$(date +%s.%N)
  "$NB/ctr" --address "$D/node$i/containerd/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$cid" >&2
  # The first renewal or acquisition after the kill: any process's write of the Lease.
  until [[ "$(k -n $NSP get lease external-endpoints-write -o jsonpath='{.spec.renewTime}')" != "$renew0" ]]; do sleep 0.2; done
  log "sigkill: first Lease write $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s after the kill (lease duration $(k -n $NSP get lease external-endpoints-write -o jsonpath='{.spec.leaseDurationSeconds}')s); restarts: $(k -n $NSP get pod "$leader" -o jsonpath='{.status.containerStatuses[0].restartCount}')"
}
move "sigkill" sigkill

# A deposed leader's write, with its real projected token, denied by the fencing policy.
deposed() {
  local leader node i uid cid token out
  leader=$(holder | cut -d' ' -f1)
  node=$(k -n $NSP get pod "$leader" -o jsonpath='{.spec.nodeName}'); i=${node#node}
  uid=$(k -n $NSP get pod "$leader" -o jsonpath='{.metadata.uid}')
  cid=$(k -n $NSP get pod "$leader" -o jsonpath='{.status.containerStatuses[0].containerID}'); cid=${cid#containerd://}
  # The token the kubelet projected into the pod (a tmpfs in the node's mount namespace).
  token=$(nsenter -t "${NODE_PID[$i]}" -m sh -c \
    "cat $D/node$i/kubelet/root/pods/$uid/volumes/kubernetes.io~projected/kube-api-access-*/token")
  log "deposed: leader $leader on $node; token read ($(printf %s "$token" | wc -c) bytes); pausing its container"
  "$NB/ctr" --address "$D/node$i/containerd/containerd.sock" -n k8s.io tasks pause "$cid" >&2
  local end=$((SECONDS + 60))
  until [[ "$(holder | cut -d' ' -f1)" != "$leader" ]]; do
    ((SECONDS < end)) || { log "deposed: the Lease did not move"; return 1; }
    sleep 0.5
  done
  log "deposed: Lease now $(holder)"
  out=$("$TB/kubectl" --kubeconfig=/dev/null --server="https://$IP:6443" --certificate-authority="$P/ca.crt" \
    --token="$token" -n demo create -f - 2>&1 <<EOS || true
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-deposed-write
  labels: {kubernetes.io/service-name: web, endpointslice.kubernetes.io/managed-by: linkerd-external-workloads-controller}
addressType: IPv4
endpoints: [{addresses: ["10.9.9.9"]}]
EOS
)
  "$NB/ctr" --address "$D/node$i/containerd/containerd.sock" -n k8s.io tasks resume "$cid" >&2
  log "deposed: its write: $out"
  if grep -q 'ValidatingAdmissionPolicy' <<<"$out"; then log "deposed: denied by the fencing policy"
  else log "FAIL: the deposed leader's write was not denied by the fencing policy"; return 1; fi
}
deposed
k -n $NSP get pods -o wide >&2
# One writer at a time, from the audit log: no slice write by a pod that did not hold the Lease.
"$HERE/audit-check.sh" "$D/audit.log" >&2 || { log "FAIL: a slice write by a non-holder"; exit 1; }
log "CHART OK"
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
