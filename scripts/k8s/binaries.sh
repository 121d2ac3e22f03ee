# kube-apiserver, kube-controller-manager, kube-scheduler and kubelet: no Debian package ships them, so
# they come from a verified prebuilt archive when one sits beside the repository, else they are built from
# Debian's `kubernetes` source package (slow: ~17 min on 2 cores). Sourced by cluster.sh.
# shellcheck shell=bash

KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
BIN_STAMP=$BIN_DIR/.source

binaries_present() {
  local b
  for b in "${KUBE_BINARIES[@]}"; do [ -x "$BIN_DIR/$b" ] || return 1; done
  [ -f "$BIN_STAMP" ]
}

# The archive and its checksum, as SHA256SUMS names them ("<sha>  <file>").
cached_archive_line() { grep -m1 -E '  \*?kube-.*\.tar\.xz$' "$KUBE_BINARY_CACHE/SHA256SUMS"; }

ensure_binaries() {
  local line
  if [ -f "$KUBE_BINARY_CACHE/SHA256SUMS" ] && line=$(cached_archive_line); then
    # Re-extract only when the cache holds a different archive than the one extracted last time.
    if binaries_present && [ "$(cat "$BIN_STAMP")" = "archive ${line%% *}" ]; then return 0; fi
    extract_cached_binaries "$line"
  elif binaries_present; then
    return 0
  else
    log "no prebuilt archive at $KUBE_BINARY_CACHE: building Kubernetes $KUBE_VERSION from Debian source (~17 min)"
    build_binaries_from_source
  fi
}

extract_cached_binaries() {
  local sha=${1%% *} file=${1##* } tmp=$BIN_DIR.tmp b
  file=${file#\*}
  (cd "$KUBE_BINARY_CACHE" && sha256sum -c --quiet --strict SHA256SUMS >/dev/null) ||
    die "$KUBE_BINARY_CACHE/$file does not match its SHA256SUMS; delete the corrupt cache or restore it"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  tar -xJf "$KUBE_BINARY_CACHE/$file" -C "$tmp"
  for b in "${KUBE_BINARIES[@]}"; do
    [ -x "$tmp/$b" ] || die "$KUBE_BINARY_CACHE/$file has no executable $b"
  done
  echo "archive $sha" >"$tmp/.source"
  rm -rf "$BIN_DIR"
  mv "$tmp" "$BIN_DIR"
}

# Debian's source package, built as the Debian tree expects (GOPATH layout, `make WHAT=...`).
build_binaries_from_source() {
  require_root "building Kubernetes from source (apt-get)"
  local src=$CACHE/kubernetes-src codename arch list out b what=""
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  arch=$(go_arch)
  have go || apt_install golang-go
  have make || apt_install make
  have dpkg-source || apt_install dpkg-dev
  have rsync || apt_install rsync   # hack/lib/golang.sh copies the built tools with it
  mkdir -p "$src"
  # A deb-src list of our own, passed to apt by option: /etc/apt is left as it was.
  list=$src/deb-src.list
  echo "deb-src $DEBIAN_MIRROR $codename main" >"$list"
  local apt_opts=(-o "Dir::Etc::SourceList=$list" -o "Dir::Etc::SourceParts=-" -o "APT::Get::List-Cleanup=0"
    -o "APT::Sandbox::User=root")
  apt-get "${apt_opts[@]}" update -q >/dev/null || die "apt-get update for $list failed (network? mirror $DEBIAN_MIRROR)"
  (cd "$src" && rm -f kubernetes_*.dsc && apt-get "${apt_opts[@]}" source --download-only -q kubernetes) >"$LOGS/build.log" 2>&1 ||
    { tail_log build; die "apt-get source kubernetes failed"; }
  rm -rf "$src/src"
  # No keyring for the .dsc signature here: dpkg-source warns and goes on; the archive's Sources index,
  # fetched through apt's signed Release file, already vouches for the files' checksums.
  (cd "$src" && dpkg-source -x kubernetes_*.dsc src) >>"$LOGS/build.log" 2>&1 || { tail_log build; die "dpkg-source -x failed in $src"; }
  mkdir -p "$src/src/.go/src/k8s.io"
  ln -sfn "$src/src" "$src/src/.go/src/k8s.io/kubernetes"
  for b in "${KUBE_BINARIES[@]}"; do what+="cmd/$b "; done
  log "make WHAT=\"${what% }\" (log: $LOGS/build.log)"
  (cd "$src/src" && GOPATH="$src/src/.go" GOCACHE="$src/go-build-cache" make WHAT="${what% }") >>"$LOGS/build.log" 2>&1 ||
    { tail_log build; die "building Kubernetes from source failed (log: $LOGS/build.log)"; }
  out=$src/src/_output/local/bin/linux/$arch
  rm -rf "$BIN_DIR.tmp"
  mkdir -p "$BIN_DIR.tmp"
  for b in "${KUBE_BINARIES[@]}"; do
    [ -x "$out/$b" ] || die "the source build produced no $out/$b"
    cp "$out/$b" "$BIN_DIR.tmp/$b"
  done
  echo "source $(basename "$src"/kubernetes_*.dsc .dsc)" >"$BIN_DIR.tmp/.source"
  rm -rf "$BIN_DIR"
  mv "$BIN_DIR.tmp" "$BIN_DIR"
}

# Debian's architecture names are Go's and OCI's for the machines this runs on (amd64, arm64).
go_arch() { dpkg --print-architecture; }
