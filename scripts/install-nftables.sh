#!/usr/bin/env bash
# Installs what the network partitions of the cluster tests and `make chaos` need: Debian's
# nftables (scripts/netns.sh drops a cut's packets with it) and iproute2 (ip netns, veth, bridge).
# Idempotent: returns at once when both are there.
set -euo pipefail

if command -v nft >/dev/null && command -v ip >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install-nftables: no nft and no apt-get: install nftables and iproute2" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "install-nftables: installing Debian's nftables and iproute2" >&2
$SUDO apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nftables iproute2 >/dev/null
