#!/usr/bin/env bash
# Builds, from the Go module proxy only (no prebuilt downloads work on our machines), the pinned
# binaries the tests and the demo cluster need, into $LBSVC_CACHE/bin (default ~/.cache/lbsvc-operator).
# A second run rebuilds nothing that is already there.
#
# Usage: hack/build-tools.sh [envtest|cluster|helm|all]
#   envtest  kube-apiserver, kubectl, etcd          (what KUBEBUILDER_ASSETS needs)
#   cluster  the above + kube-controller-manager, kube-scheduler, kubelet, kube-proxy, multus
#   helm     helm only (the chart checks need nothing else)
#   all      cluster + helm
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.8}
MULTUS_VERSION=${MULTUS_VERSION:-v4.2.3}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${LBSVC_CACHE:-$HOME/.cache/lbsvc-operator}
BIN=$CACHE/bin/$K8S_VERSION
what=${1:-all}
mkdir -p "$BIN"

k8s_bins=(kube-apiserver kubectl)
if [ "$what" != envtest ]; then
  k8s_bins+=(kube-controller-manager kube-scheduler kubelet kube-proxy)
fi

# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the staging modules with
# ./staging paths. A wrapper module that requires it and replaces each staging module with its
# published v0.X.Y version builds every cmd/ from the proxy.
build_k8s() {
  local missing=() b
  for b in "${k8s_bins[@]}"; do [ -x "$BIN/$b" ] || missing+=("k8s.io/kubernetes/cmd/$b"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  local w=$CACHE/src/k8s-$K8S_VERSION staging=v0.${K8S_VERSION#v1.} moddir gover minor ldflags p
  mkdir -p "$w"
  moddir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  gover=$(sed -n 's/^go //p' "$moddir/go.mod")
  {
    printf 'module lbsvc.local/k8sbuild\n\ngo %s\n\n' "$gover"
    grep '^godebug' "$moddir/go.mod" || true
    printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$K8S_VERSION"
    grep -E '^\s+k8s\.io/[^ ]+ => \./staging/' "$moddir/go.mod" | awk -v sv="$staging" '{print "\t" $1 " => " $1 " " sv}'
    printf ')\n'
  } >"$w/go.mod"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "building ${missing[*]##*/} $K8S_VERSION (cold: ~3-5 min on 2 cores)"
  (cd "$w" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN/" "${missing[@]}")
}

# etcd's server/v3 module root is its main package.
build_etcd() {
  [ -x "$BIN/etcd" ] && return 0
  local w=$CACHE/src/etcd-$ETCD_VERSION
  mkdir -p "$w"
  printf 'module lbsvc.local/etcdbuild\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$w/go.mod"
  echo "building etcd $ETCD_VERSION"
  (cd "$w" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
}

# The proxy serves Multus under its gopkg.in path only.
build_multus() {
  [ -x "$BIN/multus" ] && return 0
  local w=$CACHE/src/multus-$MULTUS_VERSION
  mkdir -p "$w"
  printf 'module lbsvc.local/multusbuild\n\ngo 1.26.0\n\nrequire gopkg.in/k8snetworkplumbingwg/multus-cni.v4 %s\n' "$MULTUS_VERSION" >"$w/go.mod"
  echo "building multus $MULTUS_VERSION"
  (cd "$w" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/multus" gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus)
}

# helm's go.mod has no replace directives, so a plain wrapper module builds cmd/helm. Its version
# package takes the version by ldflags, else `helm version` reports a dev build.
build_helm() {
  [ -x "$BIN/helm" ] && return 0
  local w=$CACHE/src/helm-$HELM_VERSION v=helm.sh/helm/v3/internal/version
  mkdir -p "$w"
  printf 'module lbsvc.local/helmbuild\n\ngo 1.26.0\n\nrequire helm.sh/helm/v3 %s\n' "$HELM_VERSION" >"$w/go.mod"
  echo "building helm $HELM_VERSION (cold: ~2-5 min on 2 cores)"
  (cd "$w" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X $v.version=$HELM_VERSION -X $v.gitTreeState=clean" -o "$BIN/helm" helm.sh/helm/v3/cmd/helm)
}

if [ "$what" = helm ]; then
  build_helm
  echo "$BIN"
  exit 0
fi
build_k8s
build_etcd
[ "$what" = envtest ] || build_multus
[ "$what" != all ] || build_helm
echo "$BIN"
