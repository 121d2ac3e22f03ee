#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build the orchestrator image and its matching agent-injector image offline, from this checkout's venv,
# and import both into the dev cluster (root; `cluster.sh up` first):
#
#   bash scripts/k8s/orchard-image.sh [--force] [VENV]      # default VENV: .venv of this checkout
#
# localhost/orchard-orchestrator:local — static busybox (for /bin/sh), the venv's interpreter with its
#   standard library and every shared library its extension modules need, the distributions serving
#   needs (SERVE_REQUIREMENTS and what they require, from the venv: not the gateway's or the harnesses'
#   heavy stacks) and this orchard package; the agent bundle at /opt/orchard/agent-bundle
#   (ORCHARD_K8S_AGENT_BUNDLE), so the orchestrator builds nothing at run time.
# localhost/orchard-agent:local — the injector made from that same bundle (the ConfigMap's default).
# Cached: the archives live in the work dir's cache/orchard-image/ (not in cache/images/, so `up` does not
# re-import them every time) with a key over everything they are made of; a run with the same key only
# imports them again when containerd lacks them (after a `down`/`up`): ~2 s instead of a build.
# For a real cluster, push both root file systems to your registry instead (see docs/kubernetes.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$(dirname "$here")")
. "$here/lib.sh"
. "$here/binaries.sh"
. "$here/node.sh"
. "$here/images.sh"
force=0
if [ "${1:-}" = --force ]; then force=1; shift; fi
venv=${1:-$repo/.venv}
py=$venv/bin/python
[ -x "$py" ] || die "orchard-image: no Python at $py; run 'make setup' first"
require_root "orchard-image.sh (containerd's socket is root's)"
containerd_ready >/dev/null 2>&1 || die "containerd is not running; start the cluster first: cluster.sh up"
ORCHESTRATOR_IMAGE=localhost/orchard-orchestrator:local
AGENT_IMAGE=localhost/orchard-agent:local
# What `orchard serve --backend kubernetes` imports (core dependencies minus litellm/mini-swe-agent, which
# only the gateway and the harnesses load, plus the k8s extra); their own requirements come along.
SERVE_REQUIREMENTS=(pydantic httpx sniffio fastapi uvicorn typer rich python-multipart kubernetes)
read -r prefix ver site < <("$py" -c 'import sys, sysconfig; v=f"{sys.version_info[0]}.{sys.version_info[1]}"; print(sys.base_prefix, v, sysconfig.get_path("purelib"))')
bundle=$("$py" -c 'from orchard.sandbox.bundle import ensure_agent_bundle; print(ensure_agent_bundle().path)')

# The distributions to ship: SERVE_REQUIREMENTS and everything they require (markers evaluated here),
# as "name==version" lines; the key below covers them.
dists=$("$py" - "${SERVE_REQUIREMENTS[@]}" <<'PY'
import re, sys
import importlib.metadata as md
from packaging.requirements import Requirement
seen, todo = {}, list(sys.argv[1:])
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        if name in sys.argv[1:]:
            sys.exit(f"orchard-image: {name} is not installed in this venv (pip install -e '.[k8s]')")
        continue  # an optional requirement this platform does without
    seen[key] = f"{dist.metadata['Name']}=={dist.version}"
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
print("\n".join(sorted(seen.values())))
PY
)

key=$({ echo "$ver $prefix"; echo "$dists"; basename "$bundle"; sha256sum "$0" "$here/images.sh";
        cd "$repo" && sha256sum pyproject.toml &&
        find orchard -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum; } |
      sha256sum | cut -c1-16)
store=$CACHE/orchard-image
orchestrator_archive=$store/orchestrator.oci.tar agent_archive=$store/agent.oci.tar

# Import the cached archives unless this cluster's containerd already has them from this key.
import_cached() {
  local names
  names=$(ctr_k8s images ls -q)   # captured first: grep -q closing the pipe early would fail ctr
  if [ "$(cat "$store/imported" 2>/dev/null)" = "$key $(containerd_instance)" ] &&
    grep -Fxq "$ORCHESTRATOR_IMAGE" <<<"$names" && grep -Fxq "$AGENT_IMAGE" <<<"$names"; then
    echo "up to date: $ORCHESTRATOR_IMAGE, $AGENT_IMAGE (key $key)"
    return 0
  fi
  import_archive "$ORCHESTRATOR_IMAGE" "$orchestrator_archive"
  import_archive "$AGENT_IMAGE" "$agent_archive"
  echo "$key $(containerd_instance)" >"$store/imported"
  echo "imported $ORCHESTRATOR_IMAGE, $AGENT_IMAGE (key $key)"
}

# Each `up` starts a new containerd content store: its start time tells one cluster from the next.
containerd_instance() { cat "$RUN/containerd.pid"; }

if [ "$force" = 0 ] && [ -f "$orchestrator_archive" ] && [ -f "$agent_archive" ] && [ "$(cat "$store/key" 2>/dev/null)" = "$key" ]; then
  import_cached
  exit 0
fi

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

# Packages: the files of those distributions (RECORD lists them), plus this checkout's orchard (the venv
# has it editable).
mapfile -t dist_names < <(cut -d= -f1 <<<"$dists")
"$py" - "${dist_names[@]}" >"$work/files" <<'PY'
import sys
import importlib.metadata as md
for name in sys.argv[1:]:
    for f in md.distribution(name).files or []:
        if "__pycache__" not in f.parts and not str(f).startswith(".."):
            print(f)
PY
tar -C "$site" --no-recursion -T "$work/files" -cf - | tar -C "$opt/site-packages" -xf -
tar -C "$repo" --exclude='__pycache__' -cf - orchard | tar -C "$opt/site-packages" -xf -
# orchard's own metadata: its entry points are how backends, harnesses and models are found (the editable
# install's RECORD and finder stay behind: the source is copied above).
orchard_info=$(cd "$site" && ls -d orchard-*.dist-info | head -1)
[ -n "$orchard_info" ] || die "no orchard-*.dist-info in $site: install the checkout (pip install -e '.[k8s]')"
mkdir -p "$opt/site-packages/$orchard_info"
cp "$site/$orchard_info/METADATA" "$site/$orchard_info/entry_points.txt" "$opt/site-packages/$orchard_info/"
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

mkdir -p "$store"
rm -f "$store/key" "$store/imported"
oci_archive "$ORCHESTRATOR_IMAGE" "$root" "$orchestrator_archive" '["/opt/orchard/bin/orchard"]' '["serve"]'
"$py" -m orchard.sandbox.backends.kubernetes.images --rootfs "$work/agent" >/dev/null
oci_archive "$AGENT_IMAGE" "$work/agent" "$agent_archive" \
  "$("$py" -c 'import json; from orchard.sandbox.backends.kubernetes.pods import INJECTOR_COMMAND as c; print(json.dumps(c))')"
echo "$key" >"$store/key"
echo "built $ORCHESTRATOR_IMAGE ($(du -sh "$root" | cut -f1)) and $AGENT_IMAGE (key $key)"
import_cached
