# Images built offline (no registry) and imported into containerd's k8s.io namespace. Pods use them with
# `imagePullPolicy: Never`. Each image is a one-layer OCI archive written by hand (tar + sha256sum), cached
# in the work dir, and imported by `ctr images import` on every `up`. Sourced by cluster.sh.
# shellcheck shell=bash

IMAGE_PAUSE=localhost/pause:local
IMAGE_BASE=localhost/orchard-base:local
IMAGE_DEBIAN=localhost/orchard-debian:local
DEBIAN_SUITE=${ORCHARD_K8S_DEBIAN_SUITE:-bookworm}
# The Debian image carries an interpreter so the sandbox agent can run on the image's own Python;
# orchard-base is the image without one.
DEBIAN_INCLUDE=${ORCHARD_K8S_DEBIAN_INCLUDE-python3-minimal}
IMAGE_ENV_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

image_archive() { echo "$IMAGE_CACHE/$(echo "$1" | tr '/:' '__').oci.tar"; }

json_string() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }

# add_blob DIR FILE: move FILE into the layout's blob store; prints "sha256:<hex> <size>".
add_blob() {
  local hex size
  hex=$(sha256sum "$2" | cut -d' ' -f1)
  size=$(stat -c %s "$2")
  mv "$2" "$1/blobs/sha256/$hex"
  echo "sha256:$hex $size"
}

# oci_archive NAME SRC OUT [ENTRYPOINT_JSON [CMD_JSON]]: a one-layer OCI image archive at OUT from SRC, a
# root filesystem directory or a tar of one (.tar, .tar.gz, .tgz). JSON arguments are arrays or null.
oci_archive() {
  local name=$1 src=$2 out=$3 entrypoint=${4:-null} cmd=${5:-null} arch tmp
  local layer layer_size config config_size manifest manifest_size
  arch=$(go_arch)
  mkdir -p "$IMAGE_CACHE"
  tmp=$(mktemp -d "$IMAGE_CACHE/.oci.XXXXXX")
  mkdir -p "$tmp/blobs/sha256"
  if [ -d "$src" ]; then
    tar --numeric-owner --exclude='./dev/*' -C "$src" -cf "$tmp/layer" .
  elif [ -f "$src" ]; then
    case $src in
      *.gz | *.tgz) gzip -dc "$src" >"$tmp/layer" ;;
      *) cp "$src" "$tmp/layer" ;;
    esac
  else
    rm -rf "$tmp"
    die "import_image: $src is neither a directory nor a tar file"
  fi
  # Uncompressed layer: its digest is also its diff_id.
  read -r layer layer_size < <(add_blob "$tmp" "$tmp/layer")
  printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=%s"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
    "$arch" "$IMAGE_ENV_PATH" "$entrypoint" "$cmd" "$layer" >"$tmp/config"
  read -r config config_size < <(add_blob "$tmp" "$tmp/config")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$tmp/manifest"
  read -r manifest manifest_size < <(add_blob "$tmp" "$tmp/manifest")
  # containerd names the imported image after io.containerd.image.name.
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":%s,"org.opencontainers.image.ref.name":%s}}]}' \
    "$manifest" "$manifest_size" "$arch" "$(json_string "$name")" "$(json_string "${name##*:}")" >"$tmp/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci-layout"
  tar -C "$tmp" -cf "$out.tmp" oci-layout index.json blobs
  mv "$out.tmp" "$out"
  rm -rf "$tmp"
}

import_archive() {
  ctr_k8s images import "$2" >/dev/null || die "ctr images import $2 failed"
  local names
  names=$(ctr_k8s images ls -q)   # captured first: grep -q closing the pipe early would fail ctr under pipefail
  grep -Fxq "$1" <<<"$names" || die "after importing $2, containerd has no image $1"
}

# import_image NAME ROOTFS_DIR_OR_TAR [ENTRYPOINT_JSON [CMD_JSON]]
# The hook for other images (e.g. the sandbox agent injector): builds the archive, caches it as
# cache/images/<name>.oci.tar (re-imported by every later `up`) and imports it into the running cluster.
import_image() {
  [ $# -ge 2 ] || die "usage: import_image NAME ROOTFS_DIR_OR_TAR [ENTRYPOINT_JSON [CMD_JSON]]"
  containerd_ready >/dev/null 2>&1 || die "containerd is not running; start the cluster first: cluster.sh up"
  local out
  out=$(image_archive "$1")
  oci_archive "$1" "$2" "$out" "${3:-null}" "${4:-null}"
  import_archive "$1" "$out"
}

# import_oci FILE [NAME]  (`cluster.sh import-archive`)
# An image archive as `orchard image import` takes it (an OCI layout directory or tar, a docker/podman save
# archive) into containerd, offline; with NAME it is also tagged NAME, so that a sandbox's image 'oci:NAME'
# (or NAME) finds it whatever the archive called it. Pods use it with imagePullPolicy Never/IfNotPresent.
import_oci() {
  [ $# -ge 1 ] || die "usage: cluster.sh import-archive FILE [NAME]"
  containerd_ready >/dev/null 2>&1 || die "containerd is not running; start the cluster first: cluster.sh up"
  local src=$1 name=${2:-} archive=$1 tmp="" out imported
  if [ -d "$src" ]; then
    tmp=$(mktemp --suffix=.tar "$WORKDIR/.import.XXXXXX")
    tar -C "$src" -cf "$tmp" . || { rm -f "$tmp"; die "could not tar the OCI layout $src"; }
    archive=$tmp
  fi
  [ -f "$archive" ] || die "import-archive: $src is neither an OCI layout directory nor an archive file"
  # --digests: an archive whose index names no image still gets a name (import-DATE@sha256:...) to tag.
  if ! out=$(ctr_k8s images import --digests "$archive" 2>&1); then
    [ -n "$tmp" ] && rm -f "$tmp"
    die "ctr images import $src failed: $out"
  fi
  [ -n "$tmp" ] && rm -f "$tmp"
  imported=$(sed -n 's/^unpacking \([^ ]*\) (sha256:.*/\1/p' <<<"$out" | head -n1)
  [ -n "$imported" ] || die "ctr imported no image from $src: $out"
  if [ -n "$name" ] && [ "$name" != "$imported" ]; then
    ctr_k8s images tag --force "$imported" "$name" >/dev/null || die "could not tag $imported as $name"
    imported=$name
  fi
  log "imported $src into the cluster's containerd as $imported"
}

build_pause_image() {
  local rootfs=$IMAGE_CACHE/.build.pause
  rm -rf "$rootfs"
  mkdir -p "$rootfs"
  gcc -static -Os -s -o "$rootfs/pause" "$K8S_SCRIPT_DIR/pause.c" || die "gcc -static failed for pause.c (is libc6-dev installed?)"
  oci_archive "$IMAGE_PAUSE" "$rootfs" "$(image_archive "$IMAGE_PAUSE")" '["/pause"]'
  rm -rf "$rootfs"
}

# A sandbox base without Python: static busybox, its applets, /tmp and the account files.
build_base_image() {
  local rootfs=$IMAGE_CACHE/.build.base applet
  rm -rf "$rootfs"
  mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,root,tmp,proc,sys,dev}
  chmod 1777 "$rootfs/tmp"
  chmod 700 "$rootfs/root"
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in $("$rootfs/bin/busybox" --list-full); do
    [ "$applet" = bin/busybox ] && continue
    mkdir -p "$rootfs/$(dirname "$applet")"
    ln -sf /bin/busybox "$rootfs/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  oci_archive "$IMAGE_BASE" "$rootfs" "$(image_archive "$IMAGE_BASE")" null '["/bin/sh"]'
  rm -rf "$rootfs"
}

build_debian_image() {
  local rootfs=$IMAGE_CACHE/.build.debian include=()
  [ -n "$DEBIAN_INCLUDE" ] && include=(--include="$DEBIAN_INCLUDE")
  have debootstrap || apt_install debootstrap
  unmount_under "$rootfs"
  rm -rf --one-file-system "$rootfs"
  log "debootstrap --variant=minbase $DEBIAN_SUITE (~70 s; log: $LOGS/debootstrap.log)"
  if ! debootstrap --variant=minbase "${include[@]}" "$DEBIAN_SUITE" "$rootfs" "$DEBIAN_MIRROR" >"$LOGS/debootstrap.log" 2>&1; then
    unmount_under "$rootfs"
    rm -rf --one-file-system "$rootfs"
    tail_log debootstrap
    die "debootstrap failed (log: $LOGS/debootstrap.log)"
  fi
  unmount_under "$rootfs"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  oci_archive "$IMAGE_DEBIAN" "$rootfs" "$(image_archive "$IMAGE_DEBIAN")" null '["/bin/bash"]'
  rm -rf --one-file-system "$rootfs"
}

archive_image_name() {
  tar -xOf "$1" --occurrence=1 index.json 2>/dev/null | grep -o '"io.containerd.image.name":"[^"]*"' | cut -d'"' -f4
}

# Build what is missing or older than its recipe, then import every cached archive: pause and base always,
# Debian once built, and whatever import_image added.
ensure_images() {
  local pause base archive name
  pause=$(image_archive "$IMAGE_PAUSE") base=$(image_archive "$IMAGE_BASE")
  if [ ! "$pause" -nt "$K8S_SCRIPT_DIR/pause.c" ] || [ ! "$pause" -nt "$K8S_SCRIPT_DIR/images.sh" ]; then build_pause_image; fi
  if [ ! "$base" -nt "$K8S_SCRIPT_DIR/images.sh" ]; then build_base_image; fi
  for archive in "$IMAGE_CACHE"/*.oci.tar; do
    name=$(archive_image_name "$archive") || { warn "skipping $archive: no image name in its index.json"; continue; }
    import_archive "$name" "$archive"
  done
}

# `cluster.sh images --debian [--rebuild]`: the slow Debian image, built on request and cached.
debian_image() {
  local debian
  debian=$(image_archive "$IMAGE_DEBIAN")
  if [ ! -f "$debian" ] || [ "${1:-}" = --rebuild ]; then build_debian_image; fi
  if containerd_ready >/dev/null 2>&1; then import_archive "$IMAGE_DEBIAN" "$debian"; else
    log "cached $debian; the next 'cluster.sh up' imports it"
  fi
}
