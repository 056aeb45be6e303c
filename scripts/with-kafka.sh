#!/usr/bin/env bash
# Runs a command with the repo's Kafka broker up, and stops the broker afterwards (also when the
# command fails) unless it was already running before, or KAFKA_KEEP=1 asks to leave it up (the Kafka
# demo's --keep). The command sees KAFKA_BOOTSTRAP.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
port=${KAFKA_PORT:-9092}
started=0
if ! bash "$here/kafka.sh" status >/dev/null 2>&1; then
  bash "$here/kafka.sh" up || exit 1
  started=1
fi
stop() { [ "$started" = 1 ] && [ "${KAFKA_KEEP:-0}" != 1 ] && bash "$here/kafka.sh" down; }
trap stop EXIT
trap 'exit 130' INT TERM
KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:$port} "$@"
