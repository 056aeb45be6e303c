#!/usr/bin/env bash
# Installs what the skewed-clock fault tests need (tests/faults/test_skewed_clocks.py): Debian's
# faketime (libfaketime, which skews one process's wall clock) and a C compiler for the small shim
# that keeps librdkafka's waits on real time (tests/faults/faketime/realtime_waits.c). Idempotent:
# returns at once when both are there.
set -euo pipefail

have_lib() { compgen -G "/usr/lib/*/faketime/libfaketimeMT.so.1" >/dev/null; }
if have_lib && command -v cc >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install-faketime: no libfaketime and no apt-get: install faketime and a C compiler" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "install-faketime: installing Debian's faketime and gcc" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends faketime gcc libc6-dev
have_lib
