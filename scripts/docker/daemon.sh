#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A Docker daemon of Orchard's own for the docker backend (development and CI): Debian's docker.io, started
# without systemd, with its own containerd, socket, data and bridge, all under one work dir
# (ORCHARD_DOCKER_DIR, default ~/.orchard/docker). It runs beside the Kubernetes dev cluster without
# sharing anything with it. See docs/docker.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"
. "$here/image.sh"

usage() {
  cat <<EOF
usage: daemon.sh COMMAND
  up                 start containerd + dockerd (installs docker.io when missing); idempotent
  down               stop them and undo everything 'up' did; keeps images (data/), caches and logs
  down --purge       also delete images, containers and caches
  status             each daemon and the API; exit 0 when healthy, 3 when not running, 1 when degraded
  env                shell exports for the docker backend and the docker CLI: eval "\$(daemon.sh env)"
  image [--rebuild]  build (debootstrap, ~90 s, cached) and import $SANDBOX_IMAGE
                     (Debian $DEBIAN_SUITE with $SANDBOX_PACKAGES)
work dir: $WORKDIR (ORCHARD_DOCKER_DIR)
EOF
}

take_lock() {
  exec 9>"$WORKDIR/.lock"
  flock -w 900 9 || die "another daemon.sh is still working on $WORKDIR after 15 min"
}

healthy() {
  local d
  for d in "${DAEMONS[@]}"; do daemon_alive "$d" || return 1; done
  api_ready
}

UP_FINISHED=0
on_up_exit() {
  [ "$UP_FINISHED" = 1 ] && return 0
  warn "up failed; undoing what was started (logs kept in $LOGS)"
  (daemon_down >&2) || warn "teardown after the failed up did not finish: run 'daemon.sh down'"
}

daemon_up() {
  if healthy; then
    log "already running (work dir $WORKDIR)"
    return 0
  fi
  if [ -d "$STATE" ]; then
    log "a previous daemon is partly running: removing it first"
    daemon_down
  fi
  local t0 d
  t0=$(now_us)
  mkdir -p "$STATE" "$RUN" "$LOGS" "$CACHE"
  for d in "${DAEMONS[@]}"; do : >"$LOGS/$d.log"; done
  trap on_up_exit EXIT
  log "starting dockerd (work dir $WORKDIR)"
  phase "packages" ensure_docker_packages
  phase "bridge + NAT" setup_network
  phase "containerd" start_containerd
  phase "dockerd (/_ping)" start_dockerd
  for d in "${DAEMONS[@]}"; do require_alive "$d"; done
  UP_FINISHED=1
  log "dockerd up in $(fmt_since "$t0"); use it with: eval \"\$($0 env)\""
}

daemon_down() {
  # dockerd first: it stops its containers (their shims are containerd's) and unmounts their layers.
  stop_daemon dockerd 20
  stop_daemon containerd 10
  # Whatever a killed daemon left mounted: layers, network namespaces, shm.
  unmount_under "$EXEC_ROOT" || true
  unmount_under "$DATA_ROOT" || true
  unmount_under "$CONTAINERD_DIR" || true
  teardown_network
  rm -rf --one-file-system "$STATE"
  rm -f "$DOCKER_SOCK"
  log "stopped (images kept in $DATA_ROOT)"
}

daemon_status() {
  local d pid running=0
  for d in "${DAEMONS[@]}"; do
    if pid=$(daemon_pid "$d"); then
      printf '%-12s running (pid %s)\n' "$d" "$pid"
      running=$((running + 1))
    else
      printf '%-12s stopped\n' "$d"
    fi
  done
  [ "$running" -gt 0 ] || { echo "docker: not running"; return 3; }
  if api_ready; then echo "api /_ping   ok ($DOCKER_SOCK)"; else echo "api /_ping   failing"; fi
  if healthy; then echo "docker: healthy"; else echo "docker: degraded (logs: $LOGS)"; return 1; fi
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case $cmd in
    up)
      require_root "daemon.sh up"
      take_lock
      daemon_up
      ;;
    down)
      require_root "daemon.sh down"
      take_lock
      daemon_down
      if [ "${1:-}" = --purge ]; then
        unmount_under "$DATA_ROOT" || true
        rm -rf --one-file-system "$DATA_ROOT" "$CACHE" "$LOGS" && log "images, containers, caches and logs deleted"
      fi
      ;;
    status) daemon_status ;;
    env) echo "export DOCKER_HOST=unix://$DOCKER_SOCK" ;;
    image)
      require_root "building the sandbox image (debootstrap)"
      take_lock
      healthy || die "dockerd is not running; start it first: daemon.sh up"
      mkdir -p "$LOGS" "$IMAGE_CACHE"
      sandbox_image "${1:-}"
      ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
