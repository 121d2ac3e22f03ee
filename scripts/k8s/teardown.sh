# `down`: stop everything `up` started and undo every change it made, and nothing else. Each step works
# on whatever is left, so `down` also cleans up after a failed or half-finished `up`. Sourced by cluster.sh.
# shellcheck shell=bash

# Paths outside the work dir that kubelet 1.20 and containerd 1.6 use whatever their configuration.
# Only a kubelet writes to these: removed whole when `up` created them.
KUBELET_DIRS=(/var/lib/kubelet /var/lib/kubelet/device-plugins /var/log/pods /var/log/containers)
# Shared with other CNI / containerd users: only our files go, then the directory if `up` created it and
# it is empty.
SHARED_DIRS=(/var/lib/cni /var/lib/cni/results /run/containerd /run/containerd/s)

record_outside_state() {
  local p
  for p in "${KUBELET_DIRS[@]}" "${SHARED_DIRS[@]}"; do [ -e "$p" ] || record "created:$p" 1; done
  for p in /sys/fs/cgroup/*/; do [ -e "${p}kubepods" ] || record "created:${p}kubepods" 1; done
}

# Processes: containerd's shims re-parent themselves away from containerd; they are ours when their
# -address is our socket. Pod processes are the shims' descendants.
our_shims() {
  local d cmd
  for d in /proc/[0-9]*; do
    cmd=$({ tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null) || continue   # processes come and go meanwhile
    case $cmd in *containerd-shim*" -address $CONTAINERD_SOCK "*) echo "${d#/proc/}" ;; esac
  done
}

descendants_of() {
  ps -e -o pid=,ppid= | awk -v roots="$*" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) mine[r[i]] = 1 }
    { parent[$1] = $2 }
    END {
      do { grew = 0; for (p in parent) if (!(p in mine) && (parent[p] in mine)) { mine[p] = 1; out[p] = 1; grew = 1 } } while (grew)
      for (p in out) print p
    }'
}

all_gone() { local p; for p in "$@"; do pid_running "$p" && return 1; done; return 0; }

kill_containers() {
  local shims=() pods=() sockets=() f
  mapfile -t shims < <(our_shims)
  [ ${#shims[@]} -gt 0 ] || return 0
  for f in "$CONTAINERD_STATE"/io.containerd.runtime.v2.task/*/*/address; do
    [ -f "$f" ] && sockets+=("$(sed 's|^unix://||' "$f")")
  done
  mapfile -t pods < <(descendants_of "${shims[@]}")
  [ ${#pods[@]} -eq 0 ] || kill -KILL "${pods[@]}" 2>/dev/null || true
  kill -TERM "${shims[@]}" 2>/dev/null || true
  wait_until 5 all_gone "${shims[@]}" || kill -KILL "${shims[@]}" 2>/dev/null || true
  wait_until 5 all_gone "${shims[@]}" "${pods[@]}" || warn "containerd shims or pod processes survived SIGKILL"
  for f in "${sockets[@]}"; do [ -S "$f" ] && rm -f "$f"; done
  return 0
}

pod_network_idle() {
  local tasks
  tasks=$(ctr_k8s tasks ls 2>/dev/null) || tasks=""
  [ -z "$(ip -o link show master "$BRIDGE" 2>/dev/null)" ] && ! grep -q RUNNING <<<"$tasks"
}

# With the kubelet still running, deleting the pods lets it stop them the normal way (CNI DEL included).
drain_pods() {
  daemon_alive kubelet && apiserver_ready || return 0
  kubectl_admin delete pods --all --all-namespaces --force --grace-period=0 --wait=false >/dev/null 2>&1 || return 0
  wait_until 30 pod_network_idle || warn "pods still running 30 s after deletion; killing them"
}

# Rules whose comment is our tag, and the CNI's (comment 'name: "<network>" id: "..."') with the chains
# they jump to, removed in one iptables-restore transaction per table.
flush_tagged_iptables() {
  have iptables-save || return 0
  local table rules chains script line chain
  for table in filter nat; do
    rules=$(iptables-save -t "$table" 2>/dev/null | grep -E -e "--comment $TAG( |\$)" -e "name: \\\\\"$CNI_NETWORK\\\\\" ") || continue
    chains=$(grep -oE -- '-j CNI-[0-9a-f]+' <<<"$rules" | cut -d' ' -f2 | sort -u) || true
    script="*$table"$'\n'
    while IFS= read -r line; do
      chain=$(cut -d' ' -f2 <<<"$line")
      grep -qxF -- "$chain" <<<"$chains" || script+="-D ${line#-A }"$'\n'
    done <<<"$rules"
    for chain in $chains; do script+="-F $chain"$'\n'"-X $chain"$'\n'; done
    script+="COMMIT"$'\n'
    iptables-restore -w --noflush <<<"$script" || warn "could not remove all $TAG rules from the $table table"
  done
}

restore_sysctls() {
  local entry key orig ours now
  for entry in "${TOUCHED_SYSCTLS[@]}"; do
    key=${entry%%:*}
    entry=$(recorded "sysctl.$key") || continue
    [ -n "$entry" ] || continue
    orig=${entry%%:*} ours=${entry##*:}
    now=$(cat "/proc/sys/$key")
    # Only when the value is still the one the cluster set: someone else may have changed it since.
    if [ "$orig" != "$ours" ] && [ "$now" = "$ours" ]; then echo "$orig" >"/proc/sys/$key"; fi
  done
}

remove_kubepods_cgroups() {
  local cg
  for cg in /sys/fs/cgroup/*/kubepods; do
    if [ ! -d "$cg" ] || [ "$(recorded "created:$cg")" != 1 ]; then continue; fi
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || warn "could not remove cgroup $cg (processes left in it?)"
  done
}

# Pod logs live in /var/log/pods/<ns>_<pod>_<uid> in kubelet 1.20, whatever its root dir.
remove_pod_logs() {
  local uid d link
  for d in "$KUBELET_ROOT"/pods/*/; do
    [ -d "$d" ] || continue
    uid=$(basename "$d")
    for link in /var/log/containers/*.log; do
      [ -L "$link" ] && case $(readlink "$link") in /var/log/pods/*_"$uid"/*) rm -f "$link" ;; esac
    done
    rm -rf /var/log/pods/*_"$uid"
  done
}

remove_outside_files() {
  local p
  for p in "${KUBELET_DIRS[@]}"; do
    if [ -e "$p" ] && [ "$(recorded "created:$p")" = 1 ]; then rm -rf --one-file-system "$p"; fi
  done
  # libcni's result cache: our network's entries, and CRI's loopback entries for our pod sandboxes.
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-*
  local sandbox
  for sandbox in "$CONTAINERD_ROOT"/io.containerd.grpc.v1.cri/sandboxes/* "$CONTAINERD_STATE"/io.containerd.grpc.v1.cri/sandboxes/*; do
    if [ -d "$sandbox" ]; then rm -f /var/lib/cni/results/*-"$(basename "$sandbox")"-*; fi
  done
  # Deepest first.
  for ((p = ${#SHARED_DIRS[@]} - 1; p >= 0; p--)); do
    if [ "$(recorded "created:${SHARED_DIRS[p]}")" = 1 ]; then rmdir "${SHARED_DIRS[p]}" 2>/dev/null || true; fi
  done
}

cluster_down() {
  [ -d "$STATE" ] || [ -n "$(mounts_under "$WORKDIR")" ] || { log "not running; nothing to tear down"; return 0; }
  log "tearing down (work dir $WORKDIR)"
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  drain_pods
  stop_daemon kubelet 15
  kill_containers
  stop_daemon containerd
  kill_containers   # shims that were still starting when containerd stopped
  stop_daemon kube-apiserver
  stop_daemon etcd
  remove_pod_logs
  unmount_under "$WORKDIR" || die "could not unmount everything under $WORKDIR; see the list above, then run down again"
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE" || warn "could not delete the bridge $BRIDGE"; fi
  flush_tagged_iptables
  local addr
  if addr=$(recorded lo_address_added) && [ -n "$addr" ]; then ip addr del "$addr" dev lo 2>/dev/null || true; fi
  remove_kubepods_cgroups
  restore_sysctls
  remove_outside_files
  rm -rf --one-file-system "$STATE" "$KUBECONFIG_ADMIN"
  log "down"
}
