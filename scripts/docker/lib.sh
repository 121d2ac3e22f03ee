# Settings and helpers of the Docker daemon scripts. Sourced by daemon.sh, never run alone.
# The process helpers (pid files with start times, start/stop, waits, unmounts) and apt_install are the
# Kubernetes dev cluster's (scripts/k8s/lib.sh, install-packages.sh); everything they write goes under
# this work dir, never the cluster's.
# shellcheck shell=bash

DOCKER_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../k8s/lib.sh
. "$DOCKER_SCRIPT_DIR/../k8s/lib.sh"
# shellcheck source=../k8s/install-packages.sh
. "$DOCKER_SCRIPT_DIR/../k8s/install-packages.sh"
K8S_WORKDIR=$WORKDIR   # the cluster's, from lib.sh: only read (is it running? its image cache)

WORKDIR=${ORCHARD_DOCKER_DIR:-$HOME/.orchard/docker}
case $WORKDIR in /*) ;; *) WORKDIR=$PWD/$WORKDIR ;; esac
if mkdir -p "$WORKDIR" 2>/dev/null; then WORKDIR=$(cd "$WORKDIR" && pwd -P); fi
DOCKER_SOCK=$WORKDIR/docker.sock       # the API; `daemon.sh env` exports it as DOCKER_HOST
DATA_ROOT=$WORKDIR/data                # images and containers: kept across down/up (down --purge deletes)
CACHE=$WORKDIR/cache                   # the Debian image's archive
IMAGE_CACHE=$CACHE/images
STATE=$WORKDIR/state                   # one daemon's life: removed by `down`
RUN=$STATE/run                         # pid files
RECORDS=$STATE/records                 # what `up` changed outside the work dir, for `down` to undo
EXEC_ROOT=$STATE/exec
CONTAINERD_DIR=$STATE/containerd
CONTAINERD_SOCK=$CONTAINERD_DIR/containerd.sock
LOGS=$WORKDIR/logs
DAEMONS=(containerd dockerd)
READY_TIMEOUT=${ORCHARD_DOCKER_READY_TIMEOUT:-60}

# The containers' bridge ("open" network). Our own link, not docker0, and rules tagged with our comment:
# `down` removes exactly what `up` made, next to a Kubernetes dev cluster or another Docker.
TAG=orchard-docker
BRIDGE=${ORCHARD_DOCKER_BRIDGE:-orchdock0}
BRIDGE_ADDR=${ORCHARD_DOCKER_BRIDGE_ADDR:-10.240.0.1/24}

log() { printf '[docker] %s\n' "$*"; }
warn() { printf '[docker] warning: %s\n' "$*" >&2; }
die() { printf 'daemon.sh: error: %s\n' "$*" >&2; exit 1; }
require_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (dockerd, network links, iptables); run it with sudo"; }

api() { curl -sf --max-time "${API_TIMEOUT:-5}" --unix-socket "$DOCKER_SOCK" "$@"; }
api_ready() { [ "$(api http://docker/_ping 2>/dev/null)" = OK ]; }
containerd_ready() { [ -S "$CONTAINERD_SOCK" ] && daemon_alive containerd; }

ensure_docker_packages() {
  local need=()
  [ -x /usr/sbin/dockerd ] || have dockerd || need+=(docker.io)
  have containerd || need+=(containerd)
  have runc || need+=(runc)
  [ -x /usr/bin/docker-init ] || need+=(tini)
  have iptables || need+=(iptables)
  have curl || need+=(curl)
  have ip || need+=(iproute2)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    apt_install "${need[@]}"
  fi
}

# --- network: the bridge, NAT for "open" egress, forwarding ---------------------------------------------
bridge_subnet() {
  # 10.240.0.1/24 -> 10.240.0.0/24 (the kernel's own route for the address says it)
  ip -o route show dev "$BRIDGE" proto kernel scope link 2>/dev/null | awk '{print $1; exit}'
}

setup_network() {
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    [ "$(recorded bridge_created)" = "$BRIDGE" ] ||
      die "the bridge $BRIDGE exists but this work dir did not make it (another daemon.sh work dir?): 'down' that one, or set ORCHARD_DOCKER_BRIDGE and ORCHARD_DOCKER_BRIDGE_ADDR"
  else
    local clash
    clash=$(ip -o route show to match "${BRIDGE_ADDR%/*}" | grep -v '^default' || true)
    [ -z "$clash" ] || die "the bridge address $BRIDGE_ADDR is already routed ($clash); set ORCHARD_DOCKER_BRIDGE_ADDR"
    ip link add "$BRIDGE" type bridge || die "cannot create the bridge $BRIDGE (ip link add ... type bridge)"
    record bridge_created "$BRIDGE"
    ip addr add "$BRIDGE_ADDR" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  local subnet
  subnet=$(bridge_subnet)
  [ -n "$subnet" ] || die "the bridge $BRIDGE has no IPv4 route; delete it (ip link del $BRIDGE) and run up again"
  # Containers on the bridge reach out (network "open"); nothing from outside reaches in except replies.
  ipt nat POSTROUTING -s "$subnet" ! -o "$BRIDGE" -j MASQUERADE
  ipt filter FORWARD -i "$BRIDGE" -j ACCEPT
  ipt filter FORWARD -o "$BRIDGE" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
  if [ "$(cat /proc/sys/net/ipv4/ip_forward)" != 1 ]; then
    record ip_forward_set 0
    echo 1 >/proc/sys/net/ipv4/ip_forward
  fi
}

# ipt TABLE CHAIN RULE...: insert the rule, tagged, unless it is there.
ipt() {
  local table=$1 chain=$2
  shift 2
  iptables -w -t "$table" -C "$chain" "$@" -m comment --comment "$TAG" 2>/dev/null ||
    iptables -w -t "$table" -I "$chain" "$@" -m comment --comment "$TAG"
}

# Only what this work dir's `up` made: the rules' tag and the bridge name are per machine.
teardown_network() {
  local table line args
  [ "$(recorded bridge_created)" = "$BRIDGE" ] || return 0
  if have iptables-save; then
    for table in filter nat; do
      while IFS= read -r line; do
        [ -n "$line" ] || continue
        read -ra args <<<"${line#-A }"   # no rule of ours has a quoted argument
        iptables -w -t "$table" -D "${args[@]}" || warn "could not remove the $table rule: $line"
      done < <(iptables-save -t "$table" 2>/dev/null | grep -E -e "--comment \"?$TAG\"?( |\$)" || true)
    done
  fi
  if [ "$(recorded bridge_created)" = "$BRIDGE" ]; then ip link del "$BRIDGE" 2>/dev/null || true; fi
  # ip_forward goes back to 0 only if we set it and no Kubernetes dev cluster (which needs it) is running.
  if [ -n "$(recorded ip_forward_set)" ] && [ ! -s "$K8S_WORKDIR/state/records" ]; then
    echo 0 >/proc/sys/net/ipv4/ip_forward
  fi
}

# --- containerd (our own: its socket and directories are under the work dir) and dockerd ----------------
start_containerd() {
  mkdir -p "$CONTAINERD_DIR"
  cat >"$CONTAINERD_DIR/config.toml" <<EOF
version = 2
root = "$CONTAINERD_DIR/root"
state = "$CONTAINERD_DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
oom_score = 0
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
EOF
  start_daemon containerd containerd --config "$CONTAINERD_DIR/config.toml"
  wait_until 20 test -S "$CONTAINERD_SOCK" || { require_alive containerd; die "containerd did not open $CONTAINERD_SOCK"; }
  require_alive containerd
}

start_dockerd() {
  mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
  # An empty config of our own: a system /etc/docker/daemon.json must not add or contradict flags.
  echo '{}' >"$STATE/daemon.json"
  # runc: crun fails with hybrid cgroups. nofile: raising RLIMIT_NOFILE past the host's fails without
  # CAP_SYS_RESOURCE, as does a negative oom score. No iptables of dockerd's own (it would also turn the
  # FORWARD policy to DROP for everyone): the rules are ours (setup_network). Nothing is ever published.
  start_daemon dockerd dockerd --config-file "$STATE/daemon.json" \
    --host "unix://$DOCKER_SOCK" --containerd "$CONTAINERD_SOCK" \
    --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" --pidfile "$STATE/dockerd.pid" \
    --default-runtime runc --default-ulimit nofile=1024:1024 --oom-score-adjust 0 --shutdown-timeout 5 \
    --bridge "$BRIDGE" --iptables=false --ip-masq=false --ip-forward=false --userland-proxy=false
  if ! wait_until "$READY_TIMEOUT" api_ready; then
    require_alive dockerd
    tail_log dockerd
    die "dockerd did not answer on $DOCKER_SOCK within $READY_TIMEOUT s (log: $LOGS/dockerd.log)"
  fi
}
