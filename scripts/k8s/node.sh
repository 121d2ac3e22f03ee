# The node: its address and pod network, containerd (own socket, own dirs) and the kubelet.
# Sourced by cluster.sh.
# shellcheck shell=bash

# Kernel settings the kubelet (setupKernelTunables) and the CNI bridge (ip_forward) change, with the value
# each sets: `down` puts back the original where the value is still the one they set.
TOUCHED_SYSCTLS=(net/ipv4/ip_forward:1 vm/overcommit_memory:1 vm/panic_on_oom:0 kernel/panic:10
  kernel/panic_on_oops:1 kernel/keys/root_maxkeys:1000000 kernel/keys/root_maxbytes:25000000)

record_sysctls() {
  local entry key
  for entry in "${TOUCHED_SYSCTLS[@]}"; do
    key=${entry%%:*}
    [ -n "$(recorded "sysctl.$key")" ] || record "sysctl.$key" "$(cat "/proc/sys/$key"):${entry##*:}"
  done
}

# The node IP comes first: the API server binds it (control-plane.sh), the kubelet serves on it.
add_node_address() {
  if [[ "$(ip -o addr show dev lo)" != *" $NODE_IP/32 "* ]]; then
    record lo_address_added "$NODE_IP/32"
    ip addr add "$NODE_IP/32" dev lo
  fi
}

setup_node_network() {
  # Pod traffic through the host must pass where the FORWARD policy is DROP; tagged for teardown.
  local dir
  for dir in -i -o; do
    iptables -w -C FORWARD "$dir" "$BRIDGE" -m comment --comment "$TAG" -j ACCEPT 2>/dev/null ||
      iptables -w -I FORWARD "$dir" "$BRIDGE" -m comment --comment "$TAG" -j ACCEPT
  done
  mkdir -p "$CNI_CONF_DIR" "$STATE/cni/ipam"
  # The comments that ipMasq puts on its NAT rules carry this network name, i.e. the tag.
  cat >"$CNI_CONF_DIR/10-$CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/ipam"
      }
    }
  ]
}
EOF
}

write_containerd_config() {
  mkdir -p "$STATE/containerd"
  cat >"$STATE/containerd/config.toml" <<EOF
# Only what differs from containerd's defaults; every path is in the work dir, so a system containerd
# (socket /run/containerd/containerd.sock, root /var/lib/containerd) is never touched.
version = 2
root = "$CONTAINERD_ROOT"
state = "$CONTAINERD_STATE"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "$CONTAINERD_SOCK"

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:local"
  # Without it runc fails here: "can't get final child's PID from pipe: EOF" (no CAP_SYS_RESOURCE).
  restrict_oom_score_adj = true
  # Pod network namespaces under the state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$STATE/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CNI_CONF_DIR"
EOF
}

containerd_ready() { ctr --address "$CONTAINERD_SOCK" version; }

start_containerd() {
  # A unix socket path is at most 107 bytes; containerd adds ".ttrpc".
  [ ${#CONTAINERD_SOCK} -le 100 ] || die "work dir path too long for containerd's socket ($CONTAINERD_SOCK); set ORCHARD_K8S_DIR to a shorter path"
  write_containerd_config
  start_daemon containerd containerd --config "$STATE/containerd/config.toml"
  wait_until 30 containerd_ready || { require_alive containerd; tail_log containerd; die "containerd not answering on $CONTAINERD_SOCK after 30 s"; }
}

write_kubelet_config() {
  mkdir -p "$KUBELET_ROOT"
  cat >"$STATE/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
# Only clients with a certificate from this cluster's CA (the apiserver) may use the kubelet API.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failSwapOn: false
# The only per-Pod process cap Kubernetes has; the backend honours max_processes against it.
podPidsLimit: $POD_PIDS_LIMIT
# A development machine's disk and memory are shared: evict and collect images only when nearly full.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# No KUBE-* chains in the host's iptables (there is no kube-proxy here anyway).
makeIPTablesUtilChains: false
volumePluginDir: $KUBELET_ROOT/volume-plugins
serializeImagePulls: false
EOF
}

start_kubelet() {
  require_free_ports "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT"
  write_kubelet_config
  record_sysctls
  start_daemon kubelet "$BIN_DIR/kubelet" --config="$STATE/kubelet-config.yaml" \
    --kubeconfig="$STATE/kubelet.kubeconfig" --root-dir="$KUBELET_ROOT" --cert-dir="$KUBELET_ROOT/pki" \
    --seccomp-profile-root="$KUBELET_ROOT/seccomp" --volume-plugin-dir="$KUBELET_ROOT/volume-plugins" \
    --container-runtime=remote --container-runtime-endpoint="unix://$CONTAINERD_SOCK" \
    --node-ip="$NODE_IP" --hostname-override="$NODE_NAME"
}

node_ready() {
  [ "$(kubectl_admin get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

wait_node_ready() {
  WAIT_INTERVAL=1 wait_until "$NODE_READY_TIMEOUT" node_ready && return 0
  require_alive kubelet
  tail_log containerd 15
  tail_log kubelet 30
  die "node $NODE_NAME not Ready after ${NODE_READY_TIMEOUT} s (logs: $LOGS)"
}

# Pods need the namespace's default service account, which the controller-manager creates.
wait_default_serviceaccount() {
  WAIT_INTERVAL=0.5 wait_until 60 kubectl_admin get serviceaccount default --namespace default ||
    { require_alive kube-controller-manager; tail_log kube-controller-manager; die "no default service account after 60 s"; }
}
