#!/usr/bin/env bash
# One node of the probe's cluster: containerd, kubelet and kube-proxy, sharing this process's
# network namespace (entered by probe.sh with nsenter) and a mount namespace of their own
# (unshare --mount): the kubelet's fixed paths get a private tmpfs each.
# usage (from probe.sh only): node.sh I   with HERE TB NB D CG PRIVATE_DIRS P IMG [EE_IMAGE_TAR] set
set -euo pipefail
i=$1; nip=10.77.0.$((10 + i))
name=node$i; N=$D/node$i
mount --make-rshared /
# The fixed paths again, private to this node: two kubelets would share
# /var/lib/kubelet/device-plugins/kubelet.sock, and two containerds /run/nri/nri.sock (the second
# one failed: "failed to start NRI interface: failed to create socket /var/run/nri/nri.sock:
# listen unix /var/run/nri/nri.sock: bind: address already in use").
for d in $PRIVATE_DIRS /run/containerd /run/nri /run/cdi; do mkdir -p "$d"; mount -t tmpfs tmpfs "$d"; done
C=$N/containerd; mkdir -p "$C/root" "$C/state" "$N/cni/net.d" "$N/cni/data"
cat >"$N/cni/net.d/10-bridge.conflist" <<EOC
{"cniVersion": "1.0.0", "name": "ee36",
 "plugins": [
{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
 "ipam": {"type": "host-local", "dataDir": "$N/cni/data", "ranges": [[{"subnet": "10.244.$i.0/24"}]],
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
[debug]
address = ""
[metrics]
address = ""
[plugins."io.containerd.internal.v1.opt"]
path = "$C/opt"
[plugins."io.containerd.cri.v1.images"]
snapshotter = "${SNAPSHOTTER:-overlayfs}"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "registry.k8s.io/pause:3.10.1"
[plugins."io.containerd.cri.v1.runtime"]
enable_selinux = false
netns_mounts_under_state_dir = true
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["$NB/cni"]
  conf_dir = "$N/cni/net.d"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = false
    BinaryName = "${RUNC:-$HERE/runc-sandbox.sh}"
EOC
"$NB/containerd" --config "$C/config.toml" --log-level "${CONTAINERD_LOG:-info}" >"$N/containerd.log" 2>&1 &
end=$((SECONDS + 60))
until [[ -S "$C/containerd.sock" ]]; do ((SECONDS < end)) || { echo "no containerd socket" >&2; exit 1; }; sleep 0.5; done
for img in "$IMG/pause.tar" "$IMG/tool.tar"; do
  "$NB/ctr" --address "$C/containerd.sock" -n k8s.io images import "$img" >>"$N/import.log" 2>&1
done
if [[ -n "${EE_IMAGE_TAR:-}" ]]; then
  "$NB/ctr" --address "$C/containerd.sock" -n k8s.io images import \
    --base-name docker.io/library/external-endpoints "$EE_IMAGE_TAR" >>"$N/import.log" 2>&1
fi
K=$N/kubelet; mkdir -p "$K/root" "$K/pods-logs"
# Each node's cgroup root exists in every hierarchy; cpuset needs its cpus and mems.
for h in /sys/fs/cgroup/*/; do
  [[ -f "$h/cgroup.procs" ]] || continue
  mkdir -p "$h/$CG/$name"
  if [[ -f "$h/cpuset.cpus" ]]; then
    cat "$h/cpuset.cpus" >"$h/$CG/$name/cpuset.cpus"; cat "$h/cpuset.mems" >"$h/$CG/$name/cpuset.mems"
  fi
done
cat >"$K/config.yaml" <<EOK
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $nip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: "$P/ca.crt"}}
authorization: {mode: AlwaysAllow}
tlsCertFile: "$P/serving-$name.crt"
tlsPrivateKeyFile: "$P/serving-$name.key"
cgroupDriver: cgroupfs
cgroupRoot: /$CG/$name
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$C/containerd.sock
podLogsDir: $K/pods-logs
volumePluginDir: $K/volume-plugins
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
evictionHard: {}
registerNode: true
${KUBELET_EXTRA_CONFIG:-}
EOK
"$NB/kubelet" --config="$K/config.yaml" --kubeconfig="$D/$name.kubeconfig" \
  --root-dir="$K/root" --hostname-override=$name --node-ip=$nip -v="${KUBELET_V:-2}" >"$N/kubelet.log" 2>&1 &
cat >"$N/proxy.yaml" <<EOK
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$D/proxy.kubeconfig"}
hostnameOverride: $name
mode: iptables
clusterCIDR: 10.244.0.0/16
bindAddress: $nip
nodePortAddresses: [primary]
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOK
"$NB/kube-proxy" --config="$N/proxy.yaml" -v=2 >"$N/kube-proxy.log" 2>&1 &
wait
