# Certificates, service-account keys, static tokens and kubeconfigs for one cluster. Sourced by cluster.sh.
# shellcheck shell=bash

# sign_cert NAME SUBJECT EXTENSIONS: a key and a certificate signed by the cluster CA.
sign_cert() {
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -subj "$2" -out "$PKI/$1.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 365 \
    -extfile <(printf '%s\n' "$3") -out "$PKI/$1.crt" 2>/dev/null
  rm -f "$PKI/$1.csr"
}

new_token() { openssl rand -hex 16; }

# write_kubeconfig FILE USER TOKEN
write_kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: orchard
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: orchard
  context: {cluster: orchard, user: $2}
current-context: orchard
EOF
  chmod 600 "$1"
}

generate_pki() {
  local admin node cm sched
  rm -rf "$PKI"
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -days 365 \
    -subj "/CN=orchard-k8s-ca" 2>/dev/null
  sign_cert apiserver "/CN=kube-apiserver" "$(printf '%s\n' \
    "subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,IP:$NODE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
    "extendedKeyUsage=serverAuth" "keyUsage=digitalSignature,keyEncipherment")"
  # The apiserver's identity towards the kubelet (logs, exec): the kubelet trusts only this CA, so a pod
  # that reaches the node address cannot drive the kubelet API.
  sign_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    "$(printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=digitalSignature,keyEncipherment")"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null

  admin=$(new_token) node=$(new_token) cm=$(new_token) sched=$(new_token)
  # token,user,uid,"groups"
  cat >"$STATE/tokens.csv" <<EOF
$admin,orchard-admin,orchard-admin,"system:masters"
$node,system:node:$NODE_NAME,$NODE_NAME,"system:nodes"
$cm,system:kube-controller-manager,system:kube-controller-manager
$sched,system:kube-scheduler,system:kube-scheduler
EOF
  chmod 600 "$STATE/tokens.csv"
  write_kubeconfig "$KUBECONFIG_ADMIN" orchard-admin "$admin"
  write_kubeconfig "$STATE/kubelet.kubeconfig" "system:node:$NODE_NAME" "$node"
  write_kubeconfig "$STATE/controller-manager.kubeconfig" system:kube-controller-manager "$cm"
  write_kubeconfig "$STATE/scheduler.kubeconfig" system:kube-scheduler "$sched"
}
