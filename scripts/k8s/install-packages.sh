# Debian packages the local cluster needs; installs only what is missing. Sourced by cluster.sh.
# shellcheck shell=bash

deb_installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

# apt-get install that never starts the packages' own services (a system etcd or containerd would take
# the ports and sockets this cluster uses): a policy-rc.d denies service starts for the duration.
apt_install() {
  require_root "installing ${*}"
  (
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
      chmod 755 /usr/sbin/policy-rc.d
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$@" >/dev/null; }
  ) || die "apt-get install $* failed; run it by hand to see why"
}

ensure_packages() {
  local need=()
  have etcd || need+=(etcd-server)
  have containerd && have ctr || need+=(containerd)
  have runc || need+=(runc)
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
  have iptables || need+=(iptables)
  # nft goes into the agent-injector image: the egress guard enforces sandbox egress inside each Pod.
  have nft || [ -x /usr/sbin/nft ] || need+=(nftables)
  have debootstrap || need+=(debootstrap)
  have gcc || need+=(gcc)
  deb_installed libc6-dev || need+=(libc6-dev)   # libc.a for the static pause binary
  deb_installed busybox-static || need+=(busybox-static)
  have openssl || need+=(openssl)
  have curl || need+=(curl)
  have ip && have ss || need+=(iproute2)
  have ps || need+=(procps)
  have xz || need+=(xz-utils)
  # Any kubectl will do (a newer client talks to this 1.20 API fine); Debian's matches the server.
  have kubectl || need+=(kubernetes-client)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    apt_install "${need[@]}"
  fi
}
