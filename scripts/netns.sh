#!/usr/bin/env bash
# Network namespaces joined by one bridge, for a cluster whose partitions are real ones
# (scripts/cluster.sh with KAFKA_CLUSTER_NET=netns, and `make chaos`). Needs root (ip netns).
#
#   scripts/netns.sh up              the bridge elc0 (10.77.0.1/24) in this namespace; idempotent
#   scripts/netns.sh add NAME N      namespace elc-NAME at 10.77.0.N, on a veth into the bridge
#   scripts/netns.sh del NAME        delete namespace elc-NAME (and the cuts naming it)
#   scripts/netns.sh addr NAME       print NAME's address ("host": this namespace's, 10.77.0.1)
#   scripts/netns.sh cut A B         drop every packet between A and B, both ways
#   scripts/netns.sh heal [A B]      undo that cut (no names: every cut)
#   scripts/netns.sh cuts            list the cuts in place
#   scripts/netns.sh list            the namespaces and their addresses
#   scripts/netns.sh down            delete every elc-* namespace and the bridge
#
# Nothing leaves the machine: the subnet has no gateway and no namespace a default route; the
# bridge lives only in this namespace (IP forwarding is not touched). A cut is an nftables rule on
# each side that drops the other side's packets: they vanish, as on a broken link, so connections
# hang until their own timeouts instead of failing at once; `heal` removes it and TCP carries on.
# "host" names this namespace (where the destinations and the harness run); its cuts only touch
# 10.77.0.0/24 and traffic that it sends or receives itself, never what the bridge forwards.
set -euo pipefail

BRIDGE=elc0
NET=10.77.0
PREFIX=elc-

die() { echo "netns.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "network namespaces need root"
command -v ip >/dev/null || die "no 'ip' command (Debian: apt-get install iproute2)"
command -v nft >/dev/null || die "no 'nft' command: scripts/install-nftables.sh installs Debian's nftables"

ns() { echo "$PREFIX$1"; }
exists() { ip netns list | awk '{print $1}' | grep -qx "$(ns "$1")"; }
in_ns() { local n=$1; shift; if [ "$n" = host ]; then "$@"; else ip netns exec "$(ns "$n")" "$@"; fi; }

addr() {
  [ "$1" = host ] && { echo "$NET.1"; return; }
  exists "$1" || die "no namespace $(ns "$1")"
  ip -n "$(ns "$1")" -4 -o addr show dev eth0 | awk '{split($4, a, "/"); print a[1]}'
}

up() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
}

add() {
  local name=$1 n=$2
  [[ "$name" =~ ^[a-z0-9]{1,10}$ ]] || die "a namespace name is 1-10 lowercase letters or digits: $name"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 254 ] || die "the address's last number is 2-254: $n"
  up
  if exists "$name"; then
    ip -n "$(ns "$name")" link show eth0 >/dev/null 2>&1 && return 0
    ip netns del "$(ns "$name")"  # half made (its veth failed): made again below
  fi
  # A namespace deleted a moment ago frees its veth pair asynchronously: the old host end may
  # still be there.
  ip link del "v-$name" 2>/dev/null || true
  ip netns add "$(ns "$name")"
  ip link add "v-$name" type veth peer name eth0 netns "$(ns "$name")" \
    || { ip netns del "$(ns "$name")"; die "could not link $(ns "$name") to the bridge"; }
  ip link set "v-$name" master "$BRIDGE" up
  ip -n "$(ns "$name")" addr add "$NET.$n/24" dev eth0
  ip -n "$(ns "$name")" link set eth0 up
  ip -n "$(ns "$name")" link set lo up
}

# Each side's cuts: the addresses in the set "cut" of its table "inet elc", whose input and output
# chains drop every packet from or to them (silently: no reset, no ICMP error).
table() {
  in_ns "$1" nft list table inet elc >/dev/null 2>&1 && return 0
  in_ns "$1" nft -f - <<NFT
table inet elc {
  set cut { type ipv4_addr; }
  chain input { type filter hook input priority 0; policy accept; ip saddr @cut drop; }
  chain output { type filter hook output priority 0; policy accept; ip daddr @cut drop; }
}
NFT
}

cut() {
  local a=$1 b=$2 aa bb
  [ "$a" != "$b" ] || die "a cut needs two different sides"
  aa=$(addr "$a"); bb=$(addr "$b")
  table "$a"; table "$b"
  in_ns "$a" nft add element inet elc cut "{ $bb }"
  in_ns "$b" nft add element inet elc cut "{ $aa }"
}

heal_pair() {
  local a=$1 b=$2 aa bb
  aa=$(addr "$a"); bb=$(addr "$b")
  in_ns "$a" nft delete element inet elc cut "{ $bb }" 2>/dev/null || true
  in_ns "$b" nft delete element inet elc cut "{ $aa }" 2>/dev/null || true
}

names() { ip netns list | awk '{print $1}' | sed -n "s/^$PREFIX//p"; }

cut_from() {
  in_ns "$1" nft list set inet elc cut 2>/dev/null | sed -n '/elements/,$p' | grep -oE '[0-9]+(\.[0-9]+){3}' || true
}

heal_all() {
  local n
  for n in host $(names); do in_ns "$n" nft delete table inet elc 2>/dev/null || true; done
}

list_cuts() {
  local n r
  for n in host $(names); do
    for r in $(cut_from "$n"); do echo "$n -x- $r"; done
  done
}

del() {
  local name=$1 a n
  exists "$name" || return 0
  if a=$(addr "$name" 2>/dev/null) && [ -n "$a" ]; then
    for n in host $(names); do in_ns "$n" nft delete element inet elc cut "{ $a }" 2>/dev/null || true; done
  fi
  ip netns del "$(ns "$name")"
  ip link del "v-$name" 2>/dev/null || true
}

down() {
  local n
  heal_all
  for n in $(names); do ip netns del "$(ns "$n")"; ip link del "v-$n" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
}

case "${1:-}" in
  up) up ;;
  add) [ $# -eq 3 ] || die "usage: netns.sh add NAME N"; add "$2" "$3" ;;
  del) [ $# -eq 2 ] || die "usage: netns.sh del NAME"; del "$2" ;;
  addr) [ $# -eq 2 ] || die "usage: netns.sh addr NAME"; addr "$2" ;;
  cut) [ $# -eq 3 ] || die "usage: netns.sh cut A B"; cut "$2" "$3" ;;
  heal) if [ $# -eq 3 ]; then heal_pair "$2" "$3"; elif [ $# -eq 1 ]; then heal_all; else die "usage: netns.sh heal [A B]"; fi ;;
  cuts) list_cuts ;;
  list) for n in $(names); do echo "$n $(addr "$n")"; done ;;
  down) down ;;
  *) echo "usage: scripts/netns.sh up|add NAME N|del NAME|addr NAME|cut A B|heal [A B]|cuts|list|down" >&2; exit 2 ;;
esac
