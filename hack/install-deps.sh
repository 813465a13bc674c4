#!/usr/bin/env bash
# Installs, on a fresh Debian machine, everything the tests and the demo cluster need that is not
# built from the Go module proxy. Idempotent; needs root.
set -euo pipefail

packages=(
  # data path: iptables (nft and legacy), ip tooling, traffic generators. iptables also brings
  # ebtables-nft (the `ebtables` alternative), with which the e2e split-brain test drops the
  # election's frames on the underlay bridge; the Debian package ebtables is the legacy flavour,
  # which needs the ebtable_filter module that kernels built without it (this one) lack.
  iptables iproute2 iperf3 conntrack ethtool curl
  # nft, with which a data path test makes the lb pod's table dormant (google/nftables cannot)
  nftables
  # local cluster: container runtime, CNI reference plugins (bridge, host-local, macvlan, loopback)
  containerd runc containernetworking-plugins openssl
  # scripts
  bc util-linux procps kmod ca-certificates git make
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v ebtables >/dev/null || { echo "ebtables missing: the iptables package should provide ebtables-nft" >&2; exit 1; }
echo "dependencies present"
