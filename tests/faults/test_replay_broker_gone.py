"""Kafka replays (``effects audit``, and ``trace``, ``stuck``, ``escalations``, ``sink``, which read
through the same loop) waited for ever when the broker died midway: librdkafka retries, and the
loop asked for the rest of the records again and again. Like ``tail``, a replay must give up once
no broker has answered for its bound (``--broker-timeout``), with one line on stderr and exit 1.

The broker dies midway for the audit only: ``tests/faults/broker_link.py`` runs it in a network
namespace of its own and stalls the link once 2 MB of records have come through (the audit is then
inside its replay, with most of the window still to read), then cuts it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from effect_ledger.streams.config import KafkaConfig
from tests.bench.audit import fill
from tests.faults import broker_link
from tests.faults.test_tail_broker_gone import ROOT, Lines, advertised

GIVE_UP_S = 3
WAIT = 60.0
EFFECTS = 30_000  # 90,000 events, about 20 MB: far more than gets through before the stall

pytestmark = pytest.mark.skipif(not broker_link.available(), reason="needs a network namespace (unshare -n)")


@pytest.fixture
def socket_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="bl")  # short: a Unix socket path has at most 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_audit_gives_up_with_one_line_when_the_broker_dies_midway(kafka_config: KafkaConfig, socket_dir: str) -> None:
    cfg = kafka_config
    host, port = advertised(cfg)
    if host != "127.0.0.1":
        pytest.skip(f"the broker advertises {host}: the link forwards 127.0.0.1 only")
    w = fill(cfg, EFFECTS)
    sock = os.path.join(socket_dir, "broker")
    link = broker_link.link_to((host, port), sock, stall_after=2 << 20)
    audit = [sys.executable, "-m", "effect_ledger", "audit", "--bootstrap", f"127.0.0.1:{port}", "--prefix",
             cfg.prefix, "--from", str(w.start_ms), "--to", str(w.end_ms), "--json"]  # fmt: skip
    proc = subprocess.Popen(
        [*broker_link.unshare_command(), sys.executable, "-m", "tests.faults.broker_link", "--unix", sock,
         "--port", str(port), "--", *audit],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), EFFECTS_BROKER_TIMEOUT=str(GIVE_UP_S)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        assert link.stalled.wait(WAIT), f"the audit never read 2 MB; stderr:\n{err.join()}"
        assert proc.poll() is None  # midway: it has not finished
        link.cut()  # the broker is gone, for the audit only
        cut_at = time.monotonic()
        try:
            code = proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            code = None
        elapsed = time.monotonic() - cut_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        link.cut()
    stderr = err.join()
    assert code is not None, f"the audit still running {WAIT:.0f} s after the broker died"
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("effects: "), f"exit {code}, stderr:\n{stderr}"
    assert "gave up" in lines[0] and f"{GIVE_UP_S} s" in lines[0], lines[0]
    assert out.join() == ""  # no partial report
    print(f"\naudit exited {elapsed:.1f} s after the broker died (bound {GIVE_UP_S} s): {lines[0]}")
