#!/usr/bin/env bash
# Runs one real Apache Kafka broker (KRaft, combined broker+controller) on loopback, from the
# Maven Central jars. No Docker needed.
#
#   scripts/kafka.sh fetch    resolve the jars into the cache (a second run downloads nothing)
#   scripts/kafka.sh up       fetch, format storage if new, start, wait until it answers metadata
#   scripts/kafka.sh down     stop the broker started from this checkout (by its own pid)
#   scripts/kafka.sh status   say whether it runs
#
# Settings (environment):
#   KAFKA_PORT             client port                  (default 9092)
#   KAFKA_CONTROLLER_PORT  controller port              (default KAFKA_PORT+1)
#   KAFKA_HEAP             JVM heap                     (default 512m)
#   EFFECT_LEDGER_CACHE    where jars are cached        (default ~/.cache/effect-ledger)
#   KAFKA_RUN_DIR          data, logs and pid           (default <checkout>/.kafka, secured: .kafka-secure)
#   KAFKA_SECURE=1         a secured broker instead (below)
#
# The secured broker (KAFKA_SECURE=1, default port 9392): SASL_SSL only, SCRAM-SHA-512 users, a CA
# and a broker certificate made at first start with openssl (never committed; in RUN_DIR/tls), the
# KRaft StandardAuthorizer with allow.everyone.if.no.acl.found=false and one super user, "admin"
# (its password made at first start). RUN_DIR/admin.env holds the admin's client settings
# (KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*, KAFKA_SSL_CAFILE) for `. admin.env` or `effects ... `;
# every other principal gets only the ACLs `effects acl` gives its role. The controller listener is
# on loopback too, SASL_SSL with PLAIN and its own super user, so no anonymous principal exists.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=kafka.env
. "$here/kafka.env"
# shellcheck source=kafka-lib.sh
. "$here/kafka-lib.sh"

secure=${KAFKA_SECURE:-0}
if [ "$secure" = 1 ]; then port=${KAFKA_PORT:-9392}; else port=${KAFKA_PORT:-9092}; fi
cport=${KAFKA_CONTROLLER_PORT:-$((port + 1))}
heap=${KAFKA_HEAP:-512m}
cache=${EFFECT_LEDGER_CACHE:-$HOME/.cache/effect-ledger}
libs="$cache/kafka-$KAFKA_VERSION/libs"
if [ "$secure" = 1 ]; then run=${KAFKA_RUN_DIR:-$root/.kafka-secure}; else run=${KAFKA_RUN_DIR:-$root/.kafka}; fi
pidfile="$run/broker.pid"
log="$run/broker.log"
python=${PYTHON:-$root/.venv/bin/python}

die() { echo "kafka.sh: $*" >&2; exit 1; }

need_java() {
  command -v java >/dev/null 2>&1 || die "java not found: install Java 17+ (e.g. 'apt-get install openjdk-17-jre-headless')"
  local v
  v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  [ -n "$v" ] && [ "$v" -ge 17 ] || die "Java 17+ is needed (found '${v:-unknown}')"
}

fetch() {
  if [ -f "$libs/.complete" ]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (e.g. 'apt-get install maven') to fetch Kafka $KAFKA_VERSION"
  echo "kafka.sh: resolving Apache Kafka $KAFKA_VERSION from Maven Central into $libs"
  local work
  work=$(mktemp -d)
  cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>effect-ledger</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
POM
  rm -rf "$libs.tmp"
  if ! mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$libs.tmp" > "$work/mvn.log" 2>&1; then
    tail -20 "$work/mvn.log" >&2
    die "maven could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION (log above)"
  fi
  rm -rf "$libs" && mv "$libs.tmp" "$libs" && touch "$libs/.complete"
  rm -rf "$work"
}

running() {
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# A random secret (letters and digits: it is written into JAAS lines and properties unquoted).
secret() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# The CA, the broker's certificate (loopback names) and the passwords, made once per RUN_DIR.
make_secrets() {
  command -v openssl >/dev/null 2>&1 || die "openssl not found: install it (e.g. 'apt-get install openssl')"
  local tls="$run/tls" sec="$run/secrets"
  mkdir -p "$tls" "$sec"
  chmod 700 "$tls" "$sec"
  if [ ! -f "$tls/broker-keystore.pem" ]; then
    local days=3650 w
    w=$(mktemp -d)
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days $days -subj "/CN=effect-ledger test CA" \
      -keyout "$tls/ca.key" -out "$tls/ca.pem" >"$w/log" 2>&1 || { cat "$w/log" >&2; die "openssl: CA"; }
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=localhost" -keyout "$w/broker.key" -out "$w/broker.csr" \
      >"$w/log" 2>&1 || { cat "$w/log" >&2; die "openssl: broker key"; }
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > "$w/ext"
    openssl x509 -req -in "$w/broker.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days $days \
      -sha256 -extfile "$w/ext" -out "$w/broker.pem" >"$w/log" 2>&1 || { cat "$w/log" >&2; die "openssl: broker cert"; }
    # Kafka's PEM key store: the unencrypted PKCS#8 key, then the certificate chain.
    openssl pkcs8 -topk8 -nocrypt -in "$w/broker.key" -out "$w/broker.p8" || die "openssl: pkcs8"
    cat "$w/broker.p8" "$w/broker.pem" "$tls/ca.pem" > "$tls/broker-keystore.pem"
    chmod 600 "$tls"/*
    rm -rf "$w"
  fi
  [ -f "$sec/admin" ] || { secret > "$sec/admin"; chmod 600 "$sec/admin"; }
  [ -f "$sec/controller" ] || { secret > "$sec/controller"; chmod 600 "$sec/controller"; }
  umask 077
  cat > "$run/admin.env" <<ENV
KAFKA_BOOTSTRAP=127.0.0.1:$port
KAFKA_SECURITY_PROTOCOL=SASL_SSL
KAFKA_SASL_MECHANISM=SCRAM-SHA-512
KAFKA_SASL_USERNAME=admin
KAFKA_SASL_PASSWORD=$(cat "$sec/admin")
KAFKA_SSL_CAFILE=$tls/ca.pem
ENV
}

listener_config() {
  local proto=PLAINTEXT
  [ "$secure" = 1 ] && proto=SASL_SSL
  cat <<PROPS
listeners=$proto://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=$proto://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=$proto
listener.security.protocol.map=CONTROLLER:$proto,$proto:$proto
PROPS
  [ "$secure" = 1 ] || return 0
  local admin cpw tls="$run/tls"
  admin=$(cat "$run/secrets/admin")
  cpw=$(cat "$run/secrets/controller")
  cat <<PROPS
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
sasl.mechanism.controller.protocol=PLAIN
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin";
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="controller" password="$cpw" user_controller="$cpw";
ssl.keystore.type=PEM
ssl.keystore.location=$tls/broker-keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.pem
ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:controller
PROPS
}

write_config() {
  mkdir -p "$run/data"
  [ "$secure" = 1 ] && make_secrets
  cat > "$run/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
$(listener_config)
log.dirs=$run/data
num.partitions=1
$(internal_topics 1 1 4)
PROPS
  write_log4j "$run"
}

up() {
  need_java
  fetch
  if running; then
    echo "kafka.sh: broker already running (pid $(cat "$pidfile")) on 127.0.0.1:$port"
    return 0
  fi
  write_config
  local cp="$libs/*"
  if [ ! -f "$run/data/meta.properties" ]; then
    local id scram=()
    id=$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>>"$log" | tail -1)
    # The admin's SCRAM credential must exist before the broker's own inter-broker login. (Its
    # password is on this one command line, once, at the first start: StorageTool takes it no
    # other way; the broker's own copy is in the 0600 server.properties.)
    [ "$secure" = 1 ] && scram=(--add-scram "SCRAM-SHA-512=[name=admin,password=$(cat "$run/secrets/admin")]")
    java -cp "$cp" -Dlog4j2.configurationFile="$run/log4j2.properties" kafka.tools.StorageTool \
      format -t "$id" -c "$run/server.properties" "${scram[@]}" >>"$log" 2>&1 \
      || { tail -20 "$log" >&2; die "formatting KRaft storage failed (log: $log)"; }
  fi
  # setsid: the broker must outlive the shell that started it (make, CI) and have its own group.
  setsid java -Xms"$heap" -Xmx"$heap" -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$run/log4j2.properties" \
    -cp "$cp" kafka.Kafka "$run/server.properties" >>"$log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
  local what=""
  [ "$secure" = 1 ] && what=" (SASL_SSL, ACLs; admin settings in $run/admin.env)"
  echo "kafka.sh: starting Kafka $KAFKA_VERSION (pid $(cat "$pidfile")) on 127.0.0.1:$port$what, log $run/kafka-server.log"
  [ -x "$python" ] || die "no project virtualenv at $python: run 'make venv' first"
  # The admin's settings through the environment (exported in a subshell), never on a command line.
  if ! ( if [ "$secure" = 1 ]; then set -a; . "$run/admin.env"; set +a; fi
         "$python" -m effect_ledger.streams.admin wait --bootstrap "127.0.0.1:$port" --timeout 60 ); then
    running || { tail -30 "$log" >&2; tail -30 "$run/kafka-server.log" >&2 2>/dev/null; }
    down
    die "broker did not answer a metadata request within 60 s (logs in $run)"
  fi
}

down() {
  if ! running; then
    rm -f "$pidfile"
    echo "kafka.sh: no broker running from $run"
    return 0
  fi
  local pid
  pid=$(cat "$pidfile")
  kill -TERM "$pid"
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "kafka.sh: broker $pid ignored SIGTERM for 30 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  echo "kafka.sh: broker $pid stopped"
}

status() {
  if running; then echo "kafka.sh: running (pid $(cat "$pidfile")) on 127.0.0.1:$port"; else echo "kafka.sh: not running"; return 1; fi
}

case "${1:-}" in
  fetch) fetch ;;
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/kafka.sh fetch|up|down|status" >&2; exit 2 ;;
esac
