# etcd, kube-apiserver, kube-controller-manager, kube-scheduler: all bound to 127.0.0.1. Sourced by cluster.sh.
# shellcheck shell=bash

require_free_ports() {
  local p
  for p in "$@"; do
    port_in_use "$p" && die "port $p is already in use (another etcd/Kubernetes?): 'ss -ltnp sport = :$p' shows who; stop it first"
  done
  return 0
}

etcd_healthy() { [[ "$(curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health")" == *'"health":"true"'* ]]; }
apiserver_ready() { curl -sf --max-time 2 --cacert "$PKI/ca.crt" "https://127.0.0.1:$API_PORT/readyz" >/dev/null; }

start_etcd() {
  require_free_ports "$ETCD_PORT" "$ETCD_PEER_PORT"
  start_daemon etcd etcd --name orchard --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "orchard=http://127.0.0.1:$ETCD_PEER_PORT"
  wait_until 30 etcd_healthy || { require_alive etcd; tail_log etcd; die "etcd not healthy after 30 s"; }
}

start_apiserver() {
  require_free_ports "$API_PORT"
  start_daemon kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$STATE/tokens.csv" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR"
  wait_until 60 apiserver_ready || { require_alive kube-apiserver; tail_log kube-apiserver; die "kube-apiserver not ready after 60 s"; }
}

start_controllers() {
  require_free_ports "$CM_PORT" "$SCHEDULER_PORT"
  mkdir -p "$STATE/controller-manager" "$STATE/scheduler"
  # --port=0: no insecure HTTP port. --cert-dir (self-signed serving certs) and --flex-volume-plugin-dir
  # (created when missing) default to /var/run/kubernetes and /usr/libexec/kubernetes: kept in the work dir.
  start_daemon kube-controller-manager "$BIN_DIR/kube-controller-manager" \
    --kubeconfig="$STATE/controller-manager.kubeconfig" --bind-address=127.0.0.1 --port=0 \
    --secure-port="$CM_PORT" --cert-dir="$STATE/controller-manager" --leader-elect=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR" \
    --flex-volume-plugin-dir="$STATE/controller-manager/volume-plugins"
  start_daemon kube-scheduler "$BIN_DIR/kube-scheduler" \
    --kubeconfig="$STATE/scheduler.kubeconfig" --bind-address=127.0.0.1 --port=0 \
    --secure-port="$SCHEDULER_PORT" --cert-dir="$STATE/scheduler" --leader-elect=false
}
