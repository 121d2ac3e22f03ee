# The local sandbox image, built without a registry: a Debian root file system made by the Kubernetes dev
# cluster's own debootstrap build (scripts/k8s/images.sh: build_debian_image, written as a one-layer OCI
# archive), here with the packages SWE-style tasks need, cached in this work dir and imported into the
# daemon through the Engine API (POST /images/create?fromSrc=-: the rootfs tar is the image's one layer).
# Sourced by daemon.sh.
# shellcheck shell=bash

# shellcheck source=../k8s/binaries.sh
. "$DOCKER_SCRIPT_DIR/../k8s/binaries.sh"   # go_arch
# shellcheck source=../k8s/images.sh
. "$DOCKER_SCRIPT_DIR/../k8s/images.sh"     # oci_archive, build_debian_image
SANDBOX_IMAGE=${ORCHARD_DOCKER_IMAGE:-localhost/orchard-debian:bookworm}
# git and python3 (also as `python`, as SWE-bench images have it) with pytest: a repository checkout, its
# tests and `git diff` for the patch.
SANDBOX_PACKAGES=${ORCHARD_DOCKER_DEBIAN_INCLUDE-python3,python-is-python3,python3-pytest,git,patch,ca-certificates,procps}

image_present() { api "http://docker/images/$1/json" >/dev/null 2>&1; }

# layer_of ARCHIVE OUT: the first layer blob of a one-layer OCI archive (oci_archive's output) into OUT.
layer_of() {
  local manifest layer
  manifest=$(tar -xOf "$1" index.json | grep -o '"digest":"sha256:[0-9a-f]*"' | head -1 | cut -d: -f3 | tr -d '"')
  [ -n "$manifest" ] || die "$1 has no manifest in its index.json; rebuild it: daemon.sh image --rebuild"
  layer=$(tar -xOf "$1" "blobs/sha256/$manifest" | grep -o '"layers":\[{[^]]*' | grep -o 'sha256:[0-9a-f]*' | head -1 | cut -d: -f2)
  [ -n "$layer" ] || die "$1: its manifest names no layer"
  tar -xOf "$1" "blobs/sha256/$layer" >"$2"
}

import_rootfs_image() {
  local name=$1 archive=$2 layer previous
  previous=$(api "http://docker/images/$name/json" 2>/dev/null | grep -o '"Id":"sha256:[0-9a-f]*"' | cut -d'"' -f4 || true)
  layer=$(mktemp "$IMAGE_CACHE/.layer.XXXXXX")
  layer_of "$archive" "$layer"
  # repo with the tag in it (Podman ignores a separate tag); changes: the image config an imported rootfs
  # lacks (PATH, the shell as default command).
  API_TIMEOUT=600 api -X POST -H 'Content-Type: application/x-tar' -T "$layer" \
    "http://docker/images/create?fromSrc=-&repo=$name&changes=ENV%20PATH=$IMAGE_ENV_PATH&changes=CMD%20%5B%22/bin/bash%22%5D" \
    >"$LOGS/image-import.log" || { rm -f "$layer"; die "importing $archive into dockerd failed (log: $LOGS/image-import.log)"; }
  rm -f "$layer"
  image_present "$name" || die "after the import dockerd has no image $name (log: $LOGS/image-import.log)"
  # The image this one replaced, now untagged; kept while a container still uses it.
  if [ -n "$previous" ]; then api -X DELETE "http://docker/images/$previous" >/dev/null 2>&1 || true; fi
}

# `daemon.sh image [--rebuild]`: build the archive when missing, rebuilt on request or made with another
# package list; import it when the daemon lacks the image (or it was rebuilt).
sandbox_image() {
  local archive stamp built=0
  archive=$(image_archive "$SANDBOX_IMAGE")
  stamp="$archive.packages"
  if [ ! -f "$archive" ] || [ "${1:-}" = --rebuild ] || [ "$(cat "$stamp" 2>/dev/null)" != "$SANDBOX_PACKAGES" ]; then
    have debootstrap || apt_install debootstrap
    IMAGE_DEBIAN=$SANDBOX_IMAGE DEBIAN_INCLUDE=$SANDBOX_PACKAGES build_debian_image
    echo "$SANDBOX_PACKAGES" >"$stamp"
    built=1
  fi
  if [ "$built" = 1 ] || ! image_present "$SANDBOX_IMAGE"; then
    import_rootfs_image "$SANDBOX_IMAGE" "$archive"
    log "imported $SANDBOX_IMAGE"
  else
    log "$SANDBOX_IMAGE is present"
  fi
}
