#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A real single-node Kubernetes (v1.20, Debian's build) for development and CI, all state in one work dir
# (ORCHARD_K8S_DIR, default ~/.orchard/k8s). See docs/k8s-dev-cluster.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"
. "$here/install-packages.sh"
. "$here/binaries.sh"
. "$here/pki.sh"
. "$here/control-plane.sh"
. "$here/node.sh"
. "$here/images.sh"
. "$here/teardown.sh"
. "$here/smoke.sh"

DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)

usage() {
  cat <<EOF
usage: cluster.sh COMMAND
  up                 start the cluster (installs packages, binaries and images when missing); idempotent
  down               stop it and undo everything 'up' did; keeps caches (binaries, images) and logs
  down --purge       also delete the caches
  status             each component, the API and the node; exit 0 when healthy, 3 when not running
  env                shell exports for kubectl and ctr: eval "\$(cluster.sh env)"
  smoke              create a pod (init container + emptyDir), fetch from its Pod IP, delete it
  images --debian [--rebuild]
                     build (debootstrap, ~70 s, cached) and import $IMAGE_DEBIAN
  import-image NAME ROOTFS_DIR_OR_TAR [ENTRYPOINT_JSON [CMD_JSON]]
                     make a one-layer image from a root filesystem and import it into the running cluster
  import-archive FILE [NAME]
                     import an image archive (OCI layout or tar, docker/podman save) into the running
                     cluster, tagged NAME when given (what \`orchard image import\` takes; docs/images.md)
work dir: $WORKDIR (ORCHARD_K8S_DIR)
EOF
}

# One cluster.sh at a time changes a work dir; fd 9 stays closed in the daemons (see start_daemon).
take_lock() {
  exec 9>"$WORKDIR/.lock"
  flock -w 900 9 || die "another cluster.sh is still working on $WORKDIR after 15 min"
}

cluster_healthy() {
  local d
  for d in "${DAEMONS[@]}"; do daemon_alive "$d" || return 1; done
  apiserver_ready && node_ready
}

print_env() {
  echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
  echo "export ORCHARD_K8S_POD_PIDS_LIMIT=$POD_PIDS_LIMIT"
  echo "export CONTAINERD_ADDRESS=$CONTAINERD_SOCK"
  echo "export CONTAINERD_NAMESPACE=k8s.io"
  # Where this machine is reached from Pods: a gateway run here (orchard eval's) listens there for them.
  echo "export ORCHARD_GATEWAY_HOST=$NODE_IP"
}

UP_FINISHED=0
on_up_exit() {
  [ "$UP_FINISHED" = 1 ] && return 0
  if [ "${ORCHARD_K8S_KEEP_ON_FAILURE:-0}" = 1 ]; then
    warn "up failed; the cluster is left as it is for inspection (logs: $LOGS); 'cluster.sh down' removes it"
  else
    warn "up failed; tearing down what was started (logs kept in $LOGS; ORCHARD_K8S_KEEP_ON_FAILURE=1 keeps the cluster)"
    (cluster_down >&2) || warn "teardown after the failed up did not finish: run 'cluster.sh down'"
  fi
}

cluster_up() {
  require_root "cluster.sh up"
  if cluster_healthy; then
    log "already running (work dir $WORKDIR)"
    return 0
  fi
  if [ -d "$STATE" ]; then
    log "a previous cluster is partly running: removing it first"
    cluster_down
  fi
  local t0 d
  t0=$(now_us)
  mkdir -p "$STATE" "$RUN" "$LOGS" "$CACHE"
  for d in "${DAEMONS[@]}"; do : >"$LOGS/$d.log"; done
  trap on_up_exit EXIT
  log "starting Kubernetes $KUBE_VERSION (work dir $WORKDIR)"
  phase "packages" ensure_packages
  require_free_ports "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT" "$CM_PORT" "$SCHEDULER_PORT" \
    "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT"
  phase "binaries" ensure_binaries
  record_outside_state
  phase "pki + tokens" generate_pki
  phase "node address" add_node_address
  phase "etcd" start_etcd
  phase "kube-apiserver (/readyz)" start_apiserver
  phase "controller-mgr + scheduler" start_controllers
  phase "node network" setup_node_network
  phase "API Service route" route_api_service
  phase "containerd" start_containerd
  phase "kubelet start" start_kubelet
  # Images import while the kubelet registers the node.
  phase "images (build/import)" ensure_images
  phase "node Ready" wait_node_ready
  phase "default serviceaccount" wait_default_serviceaccount
  for d in "${DAEMONS[@]}"; do require_alive "$d"; done
  UP_FINISHED=1
  log "cluster up in $(fmt_since "$t0"); use it with: eval \"\$($0 env)\""
}

cluster_status() {
  local d pid running=0
  for d in "${DAEMONS[@]}"; do
    if pid=$(daemon_pid "$d"); then
      printf '%-26s running (pid %s)\n' "$d" "$pid"
      running=$((running + 1))
    else
      printf '%-26s stopped\n' "$d"
    fi
  done
  [ "$running" -gt 0 ] || { echo "cluster: not running"; return 3; }
  if apiserver_ready; then echo "api /readyz               ok"; else echo "api /readyz               failing"; fi
  if node_ready; then echo "node $NODE_NAME         Ready"; else echo "node $NODE_NAME         not Ready"; fi
  if cluster_healthy; then echo "cluster: healthy"; else echo "cluster: degraded (logs: $LOGS)"; return 1; fi
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case $cmd in
    up)
      require_root "cluster.sh up"
      take_lock
      cluster_up
      ;;
    down)
      require_root "cluster.sh down"
      take_lock
      cluster_down
      if [ "${1:-}" = --purge ]; then rm -rf --one-file-system "$CACHE" "$LOGS" && log "caches and logs deleted"; fi
      ;;
    status) cluster_status ;;
    env) print_env ;;
    smoke)
      require_root "cluster.sh smoke (the admin kubeconfig is root's)"
      cluster_smoke
      ;;
    images)
      [ "${1:-}" = --debian ] || die "usage: cluster.sh images --debian [--rebuild]"
      require_root "building the Debian image (debootstrap)"
      take_lock
      mkdir -p "$LOGS" "$IMAGE_CACHE"
      debian_image "${2:-}"
      ;;
    import-image)
      require_root "cluster.sh import-image (containerd's socket is root's)"
      take_lock
      import_image "$@"
      ;;
    import-archive)
      require_root "cluster.sh import-archive (containerd's socket is root's)"
      take_lock
      import_oci "$@"
      ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
