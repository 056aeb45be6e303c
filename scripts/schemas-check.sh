#!/usr/bin/env bash
# Checks the schema compatibility policy (schemas/COMPATIBILITY.md) with the official Apache Avro
# Java library, resolved from Maven Central into a cache (a second run downloads nothing):
# every pair of released versions of every record, both ways, must be COMPATIBLE, and Java's
# parsingFingerprint64 of each current schema must equal the fingerprint the Python codec writes.
#
#   scripts/schemas-check.sh        (make schemas-check)
#   scripts/schemas-check.sh libs   only fetch the Avro jars; print their folder
#
# Settings: AVRO_VERSION (default 1.12.2), EFFECT_LEDGER_CACHE (default ~/.cache/effect-ledger).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
version=${AVRO_VERSION:-1.12.2}
cache=${EFFECT_LEDGER_CACHE:-$HOME/.cache/effect-ledger}
libs="$cache/avro-$version/libs"
python=${PYTHON:-$root/.venv/bin/python}

die() { echo "schemas-check: $*" >&2; exit 1; }

command -v java >/dev/null 2>&1 || die "java not found: install Java 17+ (e.g. 'apt-get install openjdk-17-jre-headless')"
if [ ! -f "$libs/.complete" ]; then
  command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (e.g. 'apt-get install maven') to fetch Apache Avro $version"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>effect-ledger</groupId><artifactId>avro-check</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.avro</groupId><artifactId>avro</artifactId><version>$version</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-nop</artifactId><version>2.0.16</version></dependency>
  </dependencies>
</project>
POM
  rm -rf "$libs.tmp"
  if ! mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$libs.tmp" > "$work/mvn.log" 2>&1; then
    tail -20 "$work/mvn.log" >&2
    die "maven could not resolve org.apache.avro:avro:$version (log above)"
  fi
  rm -rf "$libs" && mv "$libs.tmp" "$libs" && touch "$libs/.complete"
fi

if [ "${1:-}" = libs ]; then
  echo "$libs"
  exit 0
fi

out=$(java -cp "$libs/*" "$here/SchemaCheck.java" "$root/schemas") || { echo "$out"; die "incompatible schema versions (above)"; }
echo "$out" | grep -v '^FINGERPRINT'
java_fps=$(echo "$out" | sed -n 's/^FINGERPRINT //p' | sort)
py_fps=$("$python" -c '
from effect_ledger import schemas
from effect_ledger.streams.codec import schema_fingerprint
for n in sorted(schemas.NAMES):
    print(n, schema_fingerprint(schemas.load(n)).hex())' | sort)
[ "$java_fps" = "$py_fps" ] || die "Java's parsingFingerprint64 differs from the Python codec's: $(diff <(echo "$java_fps") <(echo "$py_fps") || true)"
echo "fingerprints: Java's parsingFingerprint64 equals the Python codec's for all $(echo "$py_fps" | wc -l) records"
