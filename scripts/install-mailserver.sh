#!/usr/bin/env bash
# Fetches the mail server the smtp-kind tests run against (tests/mailserver.py): GreenMail
# standalone, one jar from Maven Central with a real SMTP server and a real IMAP server in one JVM.
#
# Why GreenMail and not Debian's postfix + dovecot or mailpit: the repo already needs a JVM (Kafka
# runs from Maven Central jars, scripts/kafka.sh), so GreenMail is one 10 MB download checked
# against a pinned SHA-256, starts as an unprivileged process on loopback at the ports it is given
# in about two seconds, and needs no system configuration. postfix and dovecot are system daemons
# (a non-system instance needs a dozen config files and root-owned queue directories, and apt
# installing postfix reconfigures the machine's MTA); mailpit would be built from source through the
# Go module proxy with a Go toolchain the repo does not otherwise need. GreenMail speaks the parts
# the reconciler uses as real servers do: SMTP DATA with several envelope recipients, delivery to
# each recipient's mailbox before the 250 reply, IMAP EXAMINE, UID SEARCH HEADER, UID FETCH
# BODY.PEEK[HEADER.FIELDS].
#
# Idempotent: returns at once when java is there and the jar is in the cache (with its SHA-256). EFFECT_LEDGER_CACHE: where (default
# ~/.cache/effect-ledger, shared with scripts/kafka.sh).
set -euo pipefail

VERSION=2.1.8
SHA256=332bfed79603101308927a951c4b56e89798edf614ed354a927ac9099e8ab4e4
cache=${EFFECT_LEDGER_CACHE:-$HOME/.cache/effect-ledger}
dir="$cache/greenmail"
jar="$dir/greenmail-standalone-$VERSION.jar"
url="https://repo1.maven.org/maven2/com/icegreen/greenmail-standalone/$VERSION/greenmail-standalone-$VERSION.jar"

if ! command -v java >/dev/null; then
    # The same JVM scripts/kafka.sh runs the broker with (Java 17+; GreenMail 2.1 needs 17 too).
    if ! command -v apt-get >/dev/null; then
        echo "install-mailserver: no java and no apt-get: install Java 17 or newer" >&2
        exit 1
    fi
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    echo "install-mailserver: installing Debian's openjdk-17-jre-headless" >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless
fi
if [ -f "$jar" ] && echo "$SHA256  $jar" | sha256sum -c --quiet - 2>/dev/null; then
    exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp "$dir/.download.XXXXXX")
trap 'rm -f "$tmp"' EXIT
echo "install-mailserver: fetching GreenMail $VERSION from Maven Central" >&2
curl -fsSL --retry 3 -o "$tmp" "$url"
if ! echo "$SHA256  $tmp" | sha256sum -c --quiet -; then
    echo "install-mailserver: $url does not have the pinned SHA-256; not installed" >&2
    exit 1
fi
chmod 644 "$tmp"  # mktemp made it private; the jar is no secret
mv "$tmp" "$jar"
