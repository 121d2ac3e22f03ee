# `smoke`: one pod the way the Kubernetes backend makes them (init container filling an emptyDir, local
# image, imagePullPolicy Never), served over its Pod IP to the host, then deleted. Sourced by cluster.sh.
# shellcheck shell=bash

SMOKE_POD=orchard-smoke

smoke_manifest() {
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $SMOKE_POD
  labels: {app: orchard-smoke}
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: fill
    image: $IMAGE_BASE
    imagePullPolicy: Never
    command: [/bin/sh, -c, 'echo "smoke ok from \$HOSTNAME" > /www/index.html']
    volumeMounts: [{name: www, mountPath: /www}]
  containers:
  - name: web
    image: $IMAGE_BASE
    imagePullPolicy: Never
    command: [/bin/busybox, httpd, -f, -p, "8080", -h, /www]
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
    volumeMounts: [{name: www, mountPath: /www}]
  volumes:
  - {name: www, emptyDir: {}}
EOF
}

smoke_cleanup() { kubectl_admin delete pod "$SMOKE_POD" --force --grace-period=0 --ignore-not-found >/dev/null 2>&1 || true; }

cluster_smoke() {
  cluster_healthy || die "the cluster is not running (or not Ready): run 'cluster.sh up' first ('cluster.sh status' says what is down)"
  local t0 ip body
  kubectl_admin delete pod "$SMOKE_POD" --ignore-not-found --wait=true --timeout=30s >/dev/null
  trap smoke_cleanup EXIT
  t0=$(now_us)
  smoke_manifest | kubectl_admin create -f - >/dev/null
  if ! kubectl_admin wait --for=condition=Ready "pod/$SMOKE_POD" --timeout=60s >/dev/null; then
    kubectl_admin describe pod "$SMOKE_POD" | tail -n 20 >&2
    die "smoke pod not Ready after 60 s"
  fi
  printf '  %-26s %s\n' "pod Ready" "$(fmt_since "$t0")"
  ip=$(kubectl_admin get pod "$SMOKE_POD" -o 'jsonpath={.status.podIP}')
  body=$(curl -sf --max-time 5 "http://$ip:8080/") || die "no HTTP answer from the pod at $ip:8080"
  [ "$body" = "smoke ok from $SMOKE_POD" ] || die "unexpected answer from $ip:8080: $body"
  printf '  %-26s %s\n' "GET http://$ip:8080/" "$body"
  t0=$(now_us)
  kubectl_admin delete pod "$SMOKE_POD" --wait=true --timeout=60s >/dev/null
  printf '  %-26s %s\n' "pod deleted" "$(fmt_since "$t0")"
  trap - EXIT
  log "smoke passed"
}
