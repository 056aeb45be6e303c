#!/usr/bin/env bash
# Installs the openssl command, which scripts/kafka.sh uses to make the secured broker's CA and
# certificate (KAFKA_SECURE=1; tests/secure). Idempotent: returns at once when it is there.
set -euo pipefail
command -v openssl >/dev/null && exit 0
if ! command -v apt-get >/dev/null; then
    echo "install-openssl: no openssl and no apt-get: install openssl" >&2
    exit 1
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-openssl: installing Debian's openssl" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssl
command -v openssl >/dev/null
