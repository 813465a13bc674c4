#!/usr/bin/env bash
# Builds the project's container images as docker-archive tarballs, without a container engine
# (hack/mkimage, go-containerregistry), into $LBSVC_CACHE/images:
#   lbsvc-operator.tar  localhost/lbsvc-operator:dev  static /lbsvc-operator, user 65532
#   lbsvc-lbpod.tar     localhost/lbsvc-lbpod:dev     /usr/local/bin/lbpod + the host's iptables (nft and legacy)
#   lbsvc-echo.tar      localhost/lbsvc-echo:dev      demo backend (images/echo)
#   lbsvc-pause.tar     localhost/lbsvc-pause:dev     the pod sandbox image (images/pause)
# An image is rewritten only when its inputs (files and their bytes, layout) changed. The operator
# and lb pod images are skipped, with a warning, while cmd/operator or cmd/lbpod do not exist yet.
# Prints the directory that holds the tarballs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${LBSVC_CACHE:-$HOME/.cache/lbsvc-operator}
OUT=$CACHE/images
WORK=$OUT/build
mkdir -p "$WORK"
cd "$ROOT"

gobuild() { # gobuild OUT PKG: static, stripped; Go's own cache makes a rebuild of unchanged code cheap
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$1" "$2"
}

gobuild "$WORK/mkimage" ./hack/mkimage
gobuild "$WORK/echo" ./images/echo
gobuild "$WORK/pause" ./images/pause

# image NAME REF MKIMAGE-ARGS... : rebuild $OUT/NAME.tar when the args or any file they name changed.
image() {
  local name=$1 ref=$2; shift 2
  local a src stamp
  stamp=$( {
    echo "$ref"; printf '%s\n' "$@"
    for a in "$@"; do
      case $a in file:*) src=${a#file:}; src=${src%%:*}; sha256sum "$src" | cut -d' ' -f1 ;; esac
    done
  } | sha256sum | cut -d' ' -f1)
  if [ -f "$OUT/$name.tar" ] && [ "$(cat "$OUT/$name.inputs" 2>/dev/null)" = "$stamp" ]; then
    echo "image $ref: up to date" >&2
    return 0
  fi
  "$WORK/mkimage" -o "$OUT/$name.tar.tmp" -t "$ref" "$@" >/dev/null
  echo "image $ref: built" >&2
  mv "$OUT/$name.tar.tmp" "$OUT/$name.tar"
  echo "$stamp" >"$OUT/$name.inputs"
}

image lbsvc-pause localhost/lbsvc-pause:dev -entrypoint /pause "file:$WORK/pause:/pause:755"
image lbsvc-echo localhost/lbsvc-echo:dev -entrypoint /echo "file:$WORK/echo:/echo:755"

if compgen -G "cmd/operator/*.go" >/dev/null; then
  gobuild "$WORK/lbsvc-operator" ./cmd/operator
  image lbsvc-operator localhost/lbsvc-operator:dev -entrypoint /lbsvc-operator -user 65532:65532 \
    "file:$WORK/lbsvc-operator:/lbsvc-operator:755"
else
  echo "WARNING: cmd/operator does not exist yet: image localhost/lbsvc-operator:dev not built" >&2
fi

# The lb pod needs iptables/ip6tables in both variants (it picks the one the node uses), their
# shared libraries and the xtables extensions they dlopen, and the files they read.
lbpod_entries() {
  local f lib xtdir
  for f in /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi; do
    [ -x "$f" ] || { echo "missing $f: install the iptables package" >&2; exit 1; }
    echo "file:$f:$f:755"
  done
  for f in iptables ip6tables; do
    echo "link:xtables-nft-multi:/usr/sbin/$f-nft"
    echo "link:xtables-nft-multi:/usr/sbin/$f-nft-save"
    echo "link:xtables-nft-multi:/usr/sbin/$f-nft-restore"
    echo "link:xtables-legacy-multi:/usr/sbin/$f-legacy"
    echo "link:xtables-legacy-multi:/usr/sbin/$f-legacy-save"
    echo "link:xtables-legacy-multi:/usr/sbin/$f-legacy-restore"
    # The plain names follow the host's choice (Debian: nft); lbpod chooses explicitly anyway.
    local def=nft
    readlink -f /usr/sbin/iptables | grep -q legacy && def=legacy
    echo "link:$f-$def:/usr/sbin/$f"
    echo "link:$f-$def-save:/usr/sbin/$f-save"
    echo "link:$f-$def-restore:/usr/sbin/$f-restore"
  done
  xtdir=$(dirname "$(ls /usr/lib/*/xtables/libxt_tcp.so | head -1)")
  for f in "$xtdir"/*.so; do echo "file:$f:$f"; done
  # Every library the binaries and the extensions load, at the path the loader looks for it.
  for lib in $( { ldd /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi "$xtdir"/*.so 2>/dev/null || true; } |
      awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(0x/ {print $1}' | sort -u); do
    echo "file:$(readlink -f "$lib"):$lib:755"
  done
  for f in /etc/protocols /etc/ethertypes; do [ -f "$f" ] && echo "file:$f:$f:644"; done
  echo "dir:/run:755"
  echo "dir:/tmp:1777"
}
if compgen -G "cmd/lbpod/*.go" >/dev/null; then
  gobuild "$WORK/lbpod" ./cmd/lbpod
  mapfile -t entries < <(lbpod_entries)
  image lbsvc-lbpod localhost/lbsvc-lbpod:dev -entrypoint /usr/local/bin/lbpod \
    "file:$WORK/lbpod:/usr/local/bin/lbpod:755" "${entries[@]}"
else
  echo "WARNING: cmd/lbpod does not exist yet: image localhost/lbsvc-lbpod:dev not built" >&2
fi
echo "$OUT"
