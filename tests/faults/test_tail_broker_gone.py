"""Issue 10, item 14: ``effects tail`` flooded stderr with librdkafka's lines when the broker died, and
never exited. It must print one line and exit 1 once the broker has been gone for longer than its
bound (``--give-up-after``, or ``--broker-timeout`` / ``EFFECTS_BROKER_TIMEOUT``).

The broker must die for ``tail`` only: ``tests/faults/broker_link.py`` runs it in a network namespace
of its own, linked to the real shared broker through a forwarder the test cuts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from effect_ledger.core.effect import fold, to_state
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Intent
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.faults import broker_link
from tests.ops_expected import now_ms

ROOT = Path(__file__).resolve().parents[2]
GIVE_UP_S = 3
WAIT = 60.0

pytestmark = pytest.mark.skipif(not broker_link.available(), reason="needs a network namespace (unshare -n)")


def advertised(cfg: KafkaConfig) -> tuple[str, int]:
    brokers = AdminClient(cfg.confluent()).list_topics(timeout=10).brokers
    assert len(brokers) == 1, brokers
    b = next(iter(brokers.values()))
    return b.host, b.port


def publish_one_state(cfg: KafkaConfig) -> str:
    key = effect_key("payments", "refund.create", "run-1", "refund-1")
    t = now_ms()
    effect = fold([Intent("i1", key, t, 1, "payments", "refund.create", "default", "run-1", "refund-1", "{}", "d",
                          t + 10_000, "agent")])  # fmt: skip
    assert effect is not None
    st = to_state(effect)
    codec = default_codec()
    p = Producer(cfg.confluent())
    p.produce(cfg.topics.state, key=key.encode(), value=codec.encode(st), headers=[codec.header(st)])
    assert p.flush(30) == 0
    return key


class Lines:
    """A pipe read line by line in a thread, so the test can wait for a line with a deadline."""

    def __init__(self, pipe: object) -> None:
        self.lines: list[str] = []
        self._pipe = pipe
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self._pipe:  # type: ignore[attr-defined]
            self.lines.append(line)

    def wait_for(self, n: int, deadline: float) -> bool:
        while len(self.lines) < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def join(self) -> str:
        self._t.join(timeout=10)
        return "".join(self.lines)


@pytest.fixture
def socket_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="bl")  # short: a Unix socket path has at most 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_tail_gives_up_with_one_line_when_the_broker_dies(kafka_config: KafkaConfig, socket_dir: str) -> None:
    cfg = kafka_config
    host, port = advertised(cfg)
    if host != "127.0.0.1":
        pytest.skip(f"the broker advertises {host}: the link forwards 127.0.0.1 only")
    key = publish_one_state(cfg)
    sock = os.path.join(socket_dir, "broker")
    link = broker_link.link_to((host, port), sock)
    tail = [sys.executable, "-m", "effect_ledger", "tail", "--bootstrap", f"127.0.0.1:{port}", "--prefix", cfg.prefix,
            "--from-beginning"]  # fmt: skip
    proc = subprocess.Popen(
        [*broker_link.unshare_command(), sys.executable, "-m", "tests.faults.broker_link", "--unix", sock,
         "--port", str(port), "--", *tail],
        cwd=ROOT,
        # The bound by environment: a version of tail without it would ignore it, not refuse it.
        env=dict(os.environ, PYTHONPATH=str(ROOT), EFFECTS_BROKER_TIMEOUT=str(GIVE_UP_S)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the test stops tail with the link process
    )  # fmt: skip
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        assert out.wait_for(1, time.monotonic() + WAIT), f"tail printed nothing; stderr:\n{err.join()}"
        assert key in out.lines[0]  # following the real broker through the link

        link.cut()  # the broker is gone, for tail only
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
    floods = sum(line.startswith("%") for line in stderr.splitlines())
    assert code is not None, f"tail still running {WAIT:.0f} s after the broker died ({floods} librdkafka lines)"
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("effects: "), f"exit {code}, stderr:\n{stderr}"
    assert "gave up" in lines[0] and f"{GIVE_UP_S} s" in lines[0], lines[0]
    print(f"\ntail exited {elapsed:.1f} s after the broker died (bound {GIVE_UP_S} s)")
