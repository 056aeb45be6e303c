#!/usr/bin/env bash
# Runs a replicated Apache Kafka cluster on this machine: three KRaft nodes (each a broker and a
# controller, a quorum of three), from the same Maven Central jars as scripts/kafka.sh.
#
# Two networks (KAFKA_CLUSTER_NET):
#   loopback (default)  node N listens on 127.0.0.1:(BASE+N) for clients and 127.0.0.1:(BASE+10+N)
#                       for the quorum.
#   netns               node N runs in its own network namespace elc-nN at 10.77.0.(10+N), port 9092
#                       for clients and 9093 for the quorum, joined to the others by the bridge of
#                       scripts/netns.sh (root): `scripts/netns.sh cut n1 n2` is a real partition.
#
#   scripts/cluster.sh up            format the nodes if new, start them, wait until all three answer
#   scripts/cluster.sh down          stop every node started from this checkout
#   scripts/cluster.sh kill N        SIGKILL node N (1-3): a broker dies
#   scripts/cluster.sh start N       start node N again
#   scripts/cluster.sh pause N       SIGSTOP node N (a frozen broker: GC pause, VM stall)
#   scripts/cluster.sh resume N      SIGCONT node N
#   scripts/cluster.sh status        which nodes run
#   scripts/cluster.sh bootstrap     print the bootstrap servers
#   scripts/cluster.sh controller    print the node id of the active controller (the quorum's leader)
#
# Settings (environment):
#   KAFKA_CLUSTER_BASE     client port of node 0 (node N: BASE+N)   (default 9500)
#   KAFKA_HEAP             JVM heap per node                         (default 384m)
#   KAFKA_CLUSTER_DIR      data, logs and pids                       (default <checkout>/.kafka-cluster[-netns])
#   KAFKA_CLUSTER_NET      loopback or netns                         (default loopback)
#
# The broker defaults are a replicated deployment's: default.replication.factor 3,
# min.insync.replicas 2, unclean leader election off, and the internal topics replicated three
# times. effect-ledger creates its own topics with replication 3 on it by itself (three brokers
# answer: KafkaConfig.for_cluster).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=kafka.env
. "$here/kafka.env"
# shellcheck source=kafka-lib.sh
. "$here/kafka-lib.sh"

base=${KAFKA_CLUSTER_BASE:-9500}
heap=${KAFKA_HEAP:-384m}
cache=${EFFECT_LEDGER_CACHE:-$HOME/.cache/effect-ledger}
libs="$cache/kafka-$KAFKA_VERSION/libs"
net=${KAFKA_CLUSTER_NET:-loopback}
dir=${KAFKA_CLUSTER_DIR:-$root/.kafka-cluster$([ "$net" = netns ] && echo -netns || true)}
python=${PYTHON:-$root/.venv/bin/python}
nodes=(1 2 3)

die() { echo "cluster.sh: $*" >&2; exit 1; }
case "$net" in loopback|netns) ;; *) die "KAFKA_CLUSTER_NET is loopback or netns, not $net" ;; esac
netns() { bash "$here/netns.sh" "$@"; }
host() { if [ "$net" = netns ]; then echo "10.77.0.$((10 + $1))"; else echo 127.0.0.1; fi; }
port() { if [ "$net" = netns ]; then echo 9092; else echo $((base + $1)); fi; }
cport() { if [ "$net" = netns ]; then echo 9093; else echo $((base + 10 + $1)); fi; }
# A node's commands run in its namespace (netns) or here (loopback).
in_node() { local n=$1; shift; if [ "$net" = netns ]; then ip netns exec "elc-n$n" "$@"; else "$@"; fi; }
pidfile() { echo "$dir/n$1/node.pid"; }
running() { [ -f "$(pidfile "$1")" ] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }
bootstrap() { local out=() n; for n in "${nodes[@]}"; do out+=("$(host "$n"):$(port "$n")"); done; (IFS=,; echo "${out[*]}"); }
voters() { local out=() n; for n in "${nodes[@]}"; do out+=("$n@$(host "$n"):$(cport "$n")"); done; (IFS=,; echo "${out[*]}"); }
node_arg() { [[ "${1:-}" =~ ^[123]$ ]] || die "name a node: 1, 2 or 3"; }

write_config() {
  local n=$1 d="$dir/n$1"
  mkdir -p "$d/data"
  cat > "$d/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(voters)
listeners=PLAINTEXT://$(host "$n"):$(port "$n"),CONTROLLER://$(host "$n"):$(cport "$n")
advertised.listeners=PLAINTEXT://$(host "$n"):$(port "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$d/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
# A broker that stops heartbeating (killed, paused, cut off) is fenced after 4 s instead of 9 s, so
# its partitions get new leaders sooner (see the README's cluster section).
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=4000
$(internal_topics 3 2 6)
PROPS
  write_log4j "$d"
}

start_node() {
  local n=$1 d="$dir/n$1"
  running "$n" && return 0
  [ "$net" = netns ] && netns add "n$n" $((10 + n))
  # setsid: the node outlives the shell that started it and has its own process group. The shell
  # in between writes its own pid and execs the JVM: that pid is the node's, whatever `ip netns
  # exec` and setsid fork on the way.
  rm -f "$(pidfile "$n")"
  in_node "$n" setsid bash -c 'echo $$ > "$0"; exec "$@"' "$(pidfile "$n")" \
    java -Xms"$heap" -Xmx"$heap" -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$d/log4j2.properties" \
    -cp "$libs/*" kafka.Kafka "$d/server.properties" >>"$d/node.log" 2>&1 < /dev/null &
  for _ in $(seq 1 50); do [ -s "$(pidfile "$n")" ] && break; sleep 0.1; done
  echo "cluster.sh: node $n (pid $(cat "$(pidfile "$n")")) on $(host "$n"):$(port "$n")"
}

wait_all() {
  [ -x "$python" ] || die "no project virtualenv at $python: run 'make venv' first"
  "$python" - "$(bootstrap)" <<'PY' || return 1
import sys, time
from effect_ledger.streams.admin import admin_client
from effect_ledger.streams.config import KafkaConfig

admin = admin_client(KafkaConfig(bootstrap=sys.argv[1], log_level=0))
deadline = time.monotonic() + 90
seen = 0
while time.monotonic() < deadline:
    try:
        seen = len(admin.list_topics(timeout=2).brokers)
        if seen == 3:
            print(f"cluster.sh: 3 brokers answer at {sys.argv[1]}")
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.5)
print(f"cluster.sh: {seen} of 3 brokers answered within 90 s", file=sys.stderr)
sys.exit(1)
PY
}

up() {
  bash "$here/kafka.sh" fetch
  local n id
  if [ ! -f "$dir/cluster.id" ]; then
    mkdir -p "$dir"
    java -cp "$libs/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1 > "$dir/cluster.id"
  fi
  id=$(cat "$dir/cluster.id")
  for n in "${nodes[@]}"; do
    write_config "$n"
    if [ ! -f "$dir/n$n/data/meta.properties" ]; then
      java -cp "$libs/*" -Dlog4j2.configurationFile="$dir/n$n/log4j2.properties" kafka.tools.StorageTool \
        format -t "$id" -c "$dir/n$n/server.properties" >>"$dir/n$n/node.log" 2>&1 \
        || { tail -20 "$dir/n$n/node.log" >&2; die "formatting node $n failed"; }
    fi
    start_node "$n"
  done
  wait_all || { down; die "the cluster did not come up (logs in $dir/n*/)"; }
}

stop_node() {
  local n=$1 pid sig=${2:-TERM}
  running "$n" || { rm -f "$(pidfile "$n")"; return 0; }
  pid=$(cat "$(pidfile "$n")")
  kill -CONT "$pid" 2>/dev/null || true  # a paused node cannot stop
  kill "-$sig" "$pid"
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$(pidfile "$n")"
  echo "cluster.sh: node $n stopped ($sig)"
}

down() {
  # Every node told at once: stopped one after another, the last ones wait for a quorum that is
  # already gone. What is still running after 15 s is killed (a test cluster recovers from it).
  local n pid pids=()
  for n in "${nodes[@]}"; do
    if running "$n"; then
      pid=$(cat "$(pidfile "$n")"); pids+=("$pid")
      kill -CONT "$pid" 2>/dev/null || true
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for _ in $(seq 1 150); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for n in "${nodes[@]}"; do rm -f "$(pidfile "$n")"; done
  [ ${#pids[@]} -gt 0 ] && echo "cluster.sh: ${#pids[@]} node(s) stopped"
  if [ "$net" = netns ]; then for n in "${nodes[@]}"; do netns del "n$n"; done; fi
  return 0
}

# Each node keeps the quorum's state (leader id and epoch) in its metadata log: the one with the
# highest epoch knows the current leader.
controller() {
  "$python" - "$dir"/n*/data/__cluster_metadata-0/quorum-state <<'PY'
import json, sys
states = []
for path in sys.argv[1:]:
    try:
        with open(path) as f:
            states.append(json.load(f))
    except (OSError, ValueError):
        pass
best = max(states, key=lambda q: q.get("leaderEpoch", -1), default={})
if best.get("leaderId", -1) < 0:
    sys.exit(1)
print(best["leaderId"])
PY
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  kill) node_arg "${2:-}"; stop_node "$2" KILL ;;
  start) node_arg "${2:-}"; start_node "$2" ;;
  pause) node_arg "${2:-}"; running "$2" || die "node $2 is not running"; kill -STOP "$(cat "$(pidfile "$2")")"; echo "cluster.sh: node $2 paused" ;;
  resume) node_arg "${2:-}"; running "$2" || die "node $2 is not running"; kill -CONT "$(cat "$(pidfile "$2")")"; echo "cluster.sh: node $2 resumed" ;;
  status) for n in "${nodes[@]}"; do if running "$n"; then echo "node $n: running on $(host "$n"):$(port "$n")"; else echo "node $n: down"; fi; done ;;
  bootstrap) bootstrap ;;
  controller) controller || die "no node knows a quorum leader" ;;
  *) echo "usage: scripts/cluster.sh up|down|kill N|start N|pause N|resume N|status|bootstrap|controller" >&2; exit 2 ;;
esac
