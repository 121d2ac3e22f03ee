# Settings and helpers shared by the local-cluster scripts. Sourced by cluster.sh, never run alone.
# shellcheck shell=bash

K8S_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$K8S_SCRIPT_DIR/../.." && pwd)

# The prebuilt binaries live beside the repository (a CI checkout has ../shared next to it).
KUBE_BINARY_CACHE=${ORCHARD_K8S_BINARY_CACHE:-$REPO_ROOT/../shared/cache/kubernetes}
KUBE_VERSION=v1.20.2
DEBIAN_MIRROR=${ORCHARD_K8S_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# Network layout. The tag marks every iptables rule of this cluster (our own and the CNI's, whose comments
# carry the network name), so teardown removes exactly those and nothing of anyone else.
TAG=orchard-k8s
CNI_NETWORK=$TAG
BRIDGE=orchk8s0
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
NODE_NAME=orchard-node
# kubelet refuses a loopback node IP and no dummy link can be made without kernel modules: a /32 on lo works.
NODE_IP=10.239.255.1
ETCD_PORT=2379
ETCD_PEER_PORT=2380
API_PORT=6443
KUBELET_PORT=10250
# Each Pod's process cap (kubelet podPidsLimit), exported for the kubernetes backend by `cluster.sh env`.
POD_PIDS_LIMIT=512
KUBELET_HEALTHZ_PORT=10248
CM_PORT=10257
SCHEDULER_PORT=10259
NODE_READY_TIMEOUT=${ORCHARD_K8S_READY_TIMEOUT:-120}

WORKDIR=${ORCHARD_K8S_DIR:-$HOME/.orchard/k8s}
case $WORKDIR in /*) ;; *) WORKDIR=$PWD/$WORKDIR ;; esac
# Resolved, so it matches the mount table and process arguments exactly.
if mkdir -p "$WORKDIR" 2>/dev/null; then WORKDIR=$(cd "$WORKDIR" && pwd -P); fi
CACHE=$WORKDIR/cache          # kept across up/down: binaries, image archives, source build
BIN_DIR=$CACHE/bin
IMAGE_CACHE=$CACHE/images
STATE=$WORKDIR/state          # one cluster's life: removed by `down`
RUN=$STATE/run                # pid files
RECORDS=$STATE/records        # what `up` changed outside the work dir, for `down` to undo
LOGS=$WORKDIR/logs            # kept after `down` for post-mortems; truncated by the next `up`
PKI=$STATE/pki
KUBECONFIG_ADMIN=$WORKDIR/kubeconfig
CONTAINERD_ROOT=$STATE/containerd/root
CONTAINERD_STATE=$STATE/containerd/state
CONTAINERD_SOCK=$STATE/containerd/containerd.sock
CNI_CONF_DIR=$STATE/cni/net.d
KUBELET_ROOT=$STATE/kubelet

log() { printf '[k8s] %s\n' "$*"; }
warn() { printf '[k8s] warning: %s\n' "$*" >&2; }
die() { printf 'cluster.sh: error: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
require_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (network links, mounts, iptables); run it with sudo"; }

now_us() { echo "${EPOCHREALTIME/./}"; }
fmt_since() { local us=$(( $(now_us) - $1 )); printf '%d.%01ds' $((us / 1000000)) $((us % 1000000 / 100000)); }

# Run one step of `up` and print how long it took.
phase() {
  local name=$1 t0
  shift
  t0=$(now_us)
  "$@"
  printf '  %-26s %s\n' "$name" "$(fmt_since "$t0")"
}

# wait_until SECONDS CMD...: poll CMD (every WAIT_INTERVAL s) until it succeeds; false on timeout.
wait_until() {
  local deadline=$(( $(now_us) + $1 * 1000000 ))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$(now_us)" -lt "$deadline" ] || return 1
    sleep "${WAIT_INTERVAL:-0.25}"
  done
}

tail_log() { [ -f "$LOGS/$1.log" ] && { echo "--- last lines of $LOGS/$1.log ---" >&2; tail -n "${2:-25}" "$LOGS/$1.log" >&2; }; return 0; }

port_in_use() { [ -n "$(ss -Htln "sport = :$1")" ]; }

# --- processes: a pid file holds "PID STARTTIME" so a recycled PID is never mistaken for ours -----------
# Fields of /proc/PID/stat after the command name: [0] is the state, [19] the start time.
proc_stat_fields() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  echo "${stat##*) }"
}

proc_starttime() {
  local fields f
  fields=$(proc_stat_fields "$1") || return 1
  read -ra f <<<"$fields"
  [ "${#f[@]}" -gt 19 ] || return 1
  echo "${f[19]}"
}

# A killed process stays a zombie until its parent (here often PID 1) reaps it: that counts as gone.
pid_running() {
  local fields f
  fields=$(proc_stat_fields "$1") || return 1
  read -ra f <<<"$fields"
  [ "${f[0]:-Z}" != Z ] && [ "${f[0]}" != X ]
}

# start_daemon NAME CMD...: own session (so the whole group can be signalled), output to logs/NAME.log.
start_daemon() {
  local name=$1 pid
  shift
  # fd 9 is cluster.sh's lock: a daemon must not hold it after the script exits.
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
  pid=$!
  echo "$pid $(proc_starttime "$pid")" >"$RUN/$name.pid"
}

daemon_pid() {
  local pid start
  [ -f "$RUN/$1.pid" ] || return 1
  read -r pid start <"$RUN/$1.pid"
  [ -n "$pid" ] && pid_running "$pid" && [ "$(proc_starttime "$pid")" = "$start" ] || return 1
  echo "$pid"
}

daemon_alive() { daemon_pid "$1" >/dev/null; }

# A daemon that died during start: say so with its log instead of waiting for a timeout.
require_alive() { daemon_alive "$1" || { tail_log "$1"; die "$1 exited during start (log: $LOGS/$1.log)"; }; }

pid_gone() { ! pid_running "$1"; }

# stop_daemon NAME [GRACE_SECONDS]: TERM its process group, KILL what is left after the grace period.
stop_daemon() {
  local pid
  if pid=$(daemon_pid "$1"); then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    if ! wait_until "${2:-10}" pid_gone "$pid"; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      wait_until 5 pid_gone "$pid" || warn "$1 (pid $pid) did not exit"
    fi
  fi
  rm -f "$RUN/$1.pid"
}

# unmount_under DIR: every mount at or below DIR, deepest first (pod volumes, overlay roots, netns, shm).
mounts_under() {
  local dir
  dir=$(realpath -m "$1")
  while read -r _ _ _ _ mnt _; do
    mnt=$(printf '%b' "$mnt")   # mountinfo escapes spaces as \040
    case $mnt in "$dir" | "$dir"/*) echo "$mnt" ;; esac
  done </proc/self/mountinfo | sort -r
}

unmount_under() {
  local mnt
  for _ in 1 2 3 4 5; do
    [ -n "$(mounts_under "$1")" ] || return 0
    while read -r mnt; do
      umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    done < <(mounts_under "$1")
  done
  [ -z "$(mounts_under "$1")" ] || { warn "mounts left under $1:"; mounts_under "$1" >&2; return 1; }
}

# --- records of changes outside the work dir ---------------------------------------------------------
record() { mkdir -p "$STATE"; echo "$1=$2" >>"$RECORDS"; }
recorded() { [ -f "$RECORDS" ] && grep -m1 "^$1=" "$RECORDS" | cut -d= -f2-; }

kubectl_admin() { kubectl --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_k8s() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
