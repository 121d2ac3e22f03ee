# etcd, kube-apiserver, kube-controller-manager, kube-scheduler. All bound to 127.0.0.1, except the API
# server: it serves on the node IP (a /32 on lo, see node.sh), which the host and the pods both reach.
# Sourced by cluster.sh.
# shellcheck shell=bash

require_free_ports() {
  local p
  for p in "$@"; do
    port_in_use "$p" && die "port $p is already in use (another etcd/Kubernetes?): 'ss -ltnp sport = :$p' shows who; stop it first"
  done
  return 0
}

etcd_healthy() { [[ "$(curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health")" == *'"health":"true"'* ]]; }
apiserver_ready() { curl -sf --max-time 2 --cacert "$PKI/ca.crt" "https://$NODE_IP:$API_PORT/readyz" >/dev/null; }

start_etcd() {
  require_free_ports "$ETCD_PORT" "$ETCD_PEER_PORT"
  start_daemon etcd etcd --name orchard --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "orchard=http://127.0.0.1:$ETCD_PEER_PORT"
  wait_until 30 etcd_healthy || { require_alive etcd; tail_log etcd; die "etcd not healthy after 30 s"; }
}

# Pods reach it as every pod does on a real cluster: in-cluster clients use the `kubernetes` Service
# (KUBERNETES_SERVICE_HOST=$SERVICE_IP, port 443, set by the kubelet), whose Endpoints are the advertised
# node IP. Without kube-proxy nothing routes the Service IP, so route_api_service stands in for it.
start_apiserver() {
  require_free_ports "$API_PORT"
  start_daemon kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port="$API_PORT" \
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

# kube-proxy's job for the one Service the cluster itself needs: $SERVICE_IP:443 → the API server. One
# DNAT rule in PREROUTING (pod traffic arrives on the bridge; the host uses the kubeconfig), tagged for
# teardown. Other Service IPs still do not route (no kube-proxy): use Pod IPs.
route_api_service() {
  local rule=(PREROUTING -i "$BRIDGE" -d "$SERVICE_IP/32" -p tcp --dport 443 -m comment --comment "$TAG"
    -j DNAT --to-destination "$NODE_IP:$API_PORT")
  iptables -w -t nat -C "${rule[@]}" 2>/dev/null || iptables -w -t nat -I "${rule[@]}"
}
