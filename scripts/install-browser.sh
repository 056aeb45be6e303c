#!/usr/bin/env bash
# The headless browser the console's browser test drives: Debian's chromium and chromium-driver.
# Idempotent and quick when both are installed; installs them (apt-get, as root) when missing.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-browser: chromium and chromium-driver are missing; run as root: apt-get install -y chromium chromium-driver" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || {
  apt-get update -q >/dev/null
  apt-get install -y -q chromium chromium-driver >/dev/null
}
echo "install-browser: $(/usr/bin/chromium --version 2>/dev/null)"
