#!/usr/bin/env bash
# Installs Debian's PostgreSQL server binaries for the sink's tests (tests/postgres.py starts and
# stops its own server in a temporary folder; nothing here starts one). Idempotent: when initdb
# is already under /usr/lib/postgresql/*/bin it returns at once. Debian's package also creates and
# starts a system cluster; the tests do not use it.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install-postgres: no /usr/lib/postgresql/*/bin/initdb and no apt-get: install PostgreSQL's server binaries" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "install-postgres: installing Debian's postgresql package" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
