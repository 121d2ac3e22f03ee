#!/usr/bin/env bash
# System packages Orchard's local backend and tests use. Idempotent; a no-op when all are present.
set -euo pipefail
need=()
command -v busybox >/dev/null 2>&1 || need+=(busybox-static)   # a Python-less rootfs for tests
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# network `allowlist` on the local backend (root): a veth pair per sandbox and nftables rules
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "orchard setup: need the Debian packages ${need[*]}; run as root or install them: apt-get install ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null; apt-get install -y -q "${need[@]}" >/dev/null; }
fi
