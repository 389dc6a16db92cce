#!/usr/bin/env bash
# Feasibility probe for issue 36: one real node (containerd 2.x + kubelet + CNI bridge) beside the
# testbed's etcd, kube-apiserver, kube-controller-manager and kube-scheduler, all inside a network
# namespace of its own, and inside a PID and mount namespace of their own so that nothing
# (containerd shims included) and no mount outlives the probe.
#
# usage: sudo testbed/node/probe.sh [--keep]   (root; needs testbed/build.sh and
#        testbed/node/build.sh outputs, runc, iptables, openssl, jq)
# Writes everything to a temporary folder, printed at the start (kept with --keep or on failure
# for the logs). Exit 0: the node became Ready and a pod ran to completion.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../versions.env"; . "$here/versions.env"

if [[ "${1:-}" != --inner ]]; then
  tb=$("$here/../build.sh" 2>/dev/null | tail -n1)
  nb=${NB:-$("$here/build.sh" 2>/dev/null | tail -n1)}
  [[ -x "$tb/kube-controller-manager" ]] || { echo "probe: no kube-controller-manager in $tb (TESTBED_BUILD_KCM=1 testbed/build.sh)" >&2; exit 2; }
  for c in runc openssl jq unshare ip; do command -v $c >/dev/null || { echo "probe: $c missing" >&2; exit 2; }; done
  D=$(mktemp -d /tmp/ee36-probe.XXXXXX)
  NS=ee36-$$; created=()
  echo "probe: folder $D, network namespace $NS" >&2
  ip netns add "$NS"
  CG=ee36-$$   # the kubelet's --cgroup-root, in every cgroup v1 hierarchy
  cleanup() {
    ip netns del "$NS" 2>/dev/null || true
    # Cgroups outlive their processes: remove the tree, deepest first.
    for d in "${created[@]}"; do rmdir "$d" 2>/dev/null || true; done
    find /sys/fs/cgroup/*/"$CG" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ "${KEEP:-}" == 1 ]] || rm -rf "$D"
  }
  [[ "${1:-}" == --keep ]] && KEEP=1
  trap cleanup EXIT
  rc=0
  PRIVATE_DIRS="/var/lib/kubelet /var/lib/cni /var/log/pods /var/log/containers"
  created=()
  for d in $PRIVATE_DIRS; do [[ -e $d ]] || { mkdir -p "$d"; created+=("$d"); }; done
  # `ip netns exec` mounts a fresh /sys, without /sys/fs/cgroup: the inner script mounts these again.
  cgmounts=$(awk '$3 == "cgroup" || $3 == "cgroup2" {print $2, $3, $4}' /proc/mounts)
  # PID namespace: when the inner script (its PID 1) exits, the kernel kills every process left
  # in it, shims included. Mount namespace: every mount made inside goes with it.
  ip netns exec "$NS" unshare --pid --fork --kill-child --mount --propagation private --mount-proc \
    env PROBE_STAGE="${PROBE_STAGE:-}" TB="$tb" NB="$nb" D="$D" CG="$CG" CGMOUNTS="$cgmounts" PRIVATE_DIRS="$PRIVATE_DIRS" "$0" --inner || rc=$?
  [[ $rc == 0 ]] || { KEEP=1; echo "probe: failed ($rc); logs in $D/*.log" >&2; }
  exit $rc
fi

# ------------------------------------------------------------------ inside the namespaces
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
  if [[ -n "${3:-}" ]]; then printf 'subjectAltName=%s\n' "$3" >"$1.ext"; else : >"$1.ext"; fi
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 2 \
    -extfile "$1.ext" 2>/dev/null
}
cert apiserver /CN=kube-apiserver "IP:$IP,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
cert admin "/O=system:masters/CN=admin"
cert node1 "/O=system:nodes/CN=system:node:node1"
cert kubelet-serving /CN=node1 "IP:$IP,DNS:node1"
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
kubeconfig admin; kubeconfig node1; kubeconfig proxy
export KUBECONFIG=$D/admin.kubeconfig
k() { "$TB/kubectl" "$@"; }

# ---------------------------------------------------------------- control plane
if [[ "${PROBE_STAGE:-}" != containerd ]]; then
start etcd "$TB/etcd" --name=t --data-dir="$D/etcd" --listen-client-urls=http://127.0.0.1:2379 \
  --advertise-client-urls=http://127.0.0.1:2379 --listen-peer-urls=http://127.0.0.1:2380 \
  --initial-advertise-peer-urls=http://127.0.0.1:2380 --initial-cluster=t=http://127.0.0.1:2380 \
  --listen-metrics-urls=http://127.0.0.1:0 --unsafe-no-fsync=true
start kube-apiserver "$TB/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
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
fi

# ---------------------------------------------------------------- containerd
C=$D/containerd; mkdir -p "$C/root" "$C/state" "$D/cni/net.d" "$D/cni/data"
cat >"$D/cni/net.d/10-bridge.conflist" <<EOC
{"cniVersion": "1.0.0", "name": "ee36",
 "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$D/cni/data", "ranges": [[{"subnet": "10.244.1.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
 ]}
EOC
cat >"$C/config.toml" <<EOC
version = 3
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$C/containerd.sock"
[ttrpc]
  address = "$C/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "${SNAPSHOTTER:-overlayfs}"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.10.1"
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$NB/cni"]
    conf_dir = "$D/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = "${RUNC:-$here/runc-sandbox.sh}"
EOC
export PATH=$NB:$PATH   # containerd finds containerd-shim-runc-v2 on the PATH
start containerd "$NB/containerd" --config "$C/config.toml" --log-level "${CONTAINERD_LOG:-info}"
wait_for "containerd socket" 60 test -S "$C/containerd.sock"
ctr() { "$NB/ctr" --address "$C/containerd.sock" -n k8s.io "$@"; }

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
# pause: a static Go program that waits for a signal (the sandbox's PID 1).
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
	if len(os.Args) > 1 { // the test container: prints and exits
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
ctr images import --no-unpack=false "$IMG/pause.tar" >&2 2>&1 || ctr images import "$IMG/pause.tar" >&2
ctr images import "$IMG/tool.tar" >&2
ctr images ls -q >&2
if [[ "${PROBE_STAGE:-}" == containerd ]]; then # containerd and runc alone, without the kubelet
  ctr run --rm docker.io/library/ee36-tool:1 ee36-t1 /tool hello from ctr >&2
  log "PROBE containerd OK"; exit 0
fi

# ---------------------------------------------------------------- kubelet
K=$D/kubelet; mkdir -p "$K/root" "$K/pods-logs"
cat >"$K/config.yaml" <<EOK
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: "$P/ca.crt"}}
authorization: {mode: AlwaysAllow}
tlsCertFile: "$P/kubelet-serving.crt"
tlsPrivateKeyFile: "$P/kubelet-serving.key"
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$C/containerd.sock
podLogsDir: $K/pods-logs
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
evictionHard: {}
registerNode: true
volumePluginDir: $K/volume-plugins
cgroupRoot: /$CG
${KUBELET_EXTRA_CONFIG:-}
EOK
start kubelet "$NB/kubelet" --config="$K/config.yaml" --kubeconfig="$D/node1.kubeconfig" \
  --root-dir="$K/root" --hostname-override=node1 --node-ip=$IP -v="${KUBELET_V:-2}"
# kube-proxy (iptables mode): pods reach the API server through the `kubernetes` Service.
cat >"$D/proxy.yaml" <<EOK
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$D/proxy.kubeconfig"}
hostnameOverride: node1
mode: iptables
clusterCIDR: 10.244.0.0/16
bindAddress: $IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOK
k create clusterrolebinding ee36-proxy --clusterrole=system:node-proxier --user=system:kube-proxy >&2
start kube-proxy "$NB/kube-proxy" --config="$D/proxy.yaml" -v=2
wait_for "node1 registered" 120 k get node node1
wait_for "node1 Ready" 120 k wait --for=condition=Ready node/node1 --timeout=1s
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
    args: ["hello", "from", "node1"]
EOP
wait_for "default ServiceAccount" 60 k get sa default
wait_for "pod probe Succeeded" 120 bash -c "[[ \$($TB/kubectl get pod probe -o jsonpath={.status.phase}) == Succeeded ]]"
k logs probe >&2
k get pod probe -o wide >&2
log "PROBE OK"
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
