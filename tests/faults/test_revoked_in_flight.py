"""A batch still being written when its partitions are revoked must be written before the next
owner reads the changelog: otherwise its records land after the next owner's, and the compacted
changelog and effects.state keep an older state for good.

Worker A folds every key's Executed event, but Kafka is slow to acknowledge A's writes (only A's
fold writer: ``broker_link.hold`` stalls the requests of that one client, while A's consumer keeps
its place in the group). Worker B joins meanwhile and the Receipts are written. A used to let its
partitions go at once: B took half of them, recovered the changelog without A's batch, folded the
Executed event again and the Receipt; then A's batch arrived, last. effects.state and the
changelog ended on EXECUTED for B's keys, and a worker rebuilt from the changelog served EXECUTED,
its Receipt lost (the group had committed it). A revoked worker now waits for the batch in flight
before it lets its partitions go, and folds nothing of theirs afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Self

import pytest

from effect_ledger.core.effect import fold, to_state
from effect_ledger.processors.batch_writer import CLIENT_ID
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.faults import broker_link
from tests.faults._flow import (
    commits,
    committed_through_end,
    describe,
    key_events,
    mismatches,
    now_ms,
    published,
    rebuilt,
    settled,
    write_each,
)
from tests.faults.test_tail_broker_gone import advertised
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, one_key_per_partition, running

ROOT = Path(__file__).resolve().parents[2]
WAIT = 120.0

pytestmark = pytest.mark.skipif(not broker_link.available(), reason="needs a network namespace (unshare -n)")


class LinkedProcessor(Processor):
    """``effects worker`` in a network namespace of its own: every byte it exchanges with Kafka
    goes through the test's ``broker_link`` (its web view is inside the namespace, out of reach)."""

    def __init__(
        self, cfg: KafkaConfig, data_dir: Path, sock: str, broker_port: int, drain_s: float | None = None
    ) -> None:
        super().__init__(cfg, data_dir)
        self.sock, self.broker_port = sock, broker_port
        if drain_s is not None:
            self.args += ["--drain-timeout", str(drain_s)]

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen(
            [*broker_link.unshare_command(), sys.executable, "-m", "tests.faults.broker_link", "--unix", self.sock,
             "--port", str(self.broker_port), "--", sys.executable, "-m", "effect_ledger", *self.args],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the link's process and the worker: one group, killed together
        )  # fmt: skip
        return self

    def kill(self) -> None:
        if self.proc is not None and self.alive:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 30) -> None:
        self.kill()  # a SIGTERM would end the link first, and the worker's goodbye with it


@pytest.fixture
def socket_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="bl")  # short: a Unix socket path has at most 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _scenario(cfg: KafkaConfig, shape: str) -> tuple[int, list[str], dict[str, list[Any]], dict[str, Any]]:
    """The broker's port, a key per partition, each key's events of ``shape`` and its single fold."""
    host, port = advertised(cfg)
    if host != "127.0.0.1":
        pytest.skip(f"the broker advertises {host}: the link forwards 127.0.0.1 only")
    keys = one_key_per_partition("payments:in-flight-", cfg.partitions)
    t = now_ms()
    events = {k: key_events(k, shape, t) for k in keys}
    folded = {k: fold(evs) for k, evs in events.items()}
    return port, keys, events, {k: to_state(e) for k, e in folded.items() if e is not None}


class Linked(NamedTuple):
    """A worker linked to the broker (``LinkedProcessor``), its link, and a key per partition with
    each key's events of a shape and its single fold."""

    link: broker_link.Forwarder
    worker: LinkedProcessor
    keys: list[str]
    events: dict[str, list[Any]]
    expected: dict[str, Any]


def linked(cfg: KafkaConfig, data_dir: Path, socket_dir: str, shape: str, drain_s: float | None = None) -> Linked:
    port, keys, events, expected = _scenario(cfg, shape)
    sock = os.path.join(socket_dir, "broker")
    link = broker_link.link_to(("127.0.0.1", port), sock)
    return Linked(link, LinkedProcessor(cfg, data_dir, sock, port, drain_s), keys, events, expected)


@pytest.mark.timeout(600)
def test_a_batch_in_flight_at_revocation_lands_before_the_next_owner_folds(
    kafka_config: KafkaConfig, tmp_path: Path, socket_dir: str
) -> None:
    cfg = kafka_config
    # each key: its intent, executed and receipt events
    link, a, keys, events, expected = linked(cfg, tmp_path / "data-a", socket_dir, "confirmed")
    b = Processor(cfg, tmp_path / "data-b")
    write = write_each(RawProducer(cfg), keys, events)

    with TopicReader(cfg, cfg.topics.state) as states, running(a):
        write(0)
        wait_for(lambda: published(states, keys, "PENDING"), WAIT, "worker A to fold every key's intent")

        link.hold(CLIENT_ID)  # A's writes wait for the broker; its consumer does not
        write(1)
        assert link.holding.wait(WAIT), "A did not write its batch of Executed events"

        with running(b):
            # Pacing only: before the fix B owned half of the partitions within seconds, and folded.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (b.health() or {}).get("ready"):
                time.sleep(0.2)
            write(2)
            owned = set((b.health() or {}).get("partitions") or ())
            ours = [k for k in keys if partition_for(k.encode(), cfg.partitions) in owned]
            deadline = time.monotonic() + 10
            while ours and time.monotonic() < deadline and not published(states, ours, "CONFIRMED"):
                time.sleep(0.2)
            link.release()

            b.wait_ready(WAIT)
            settled(cfg, states, expected, WAIT)
    rebuilt(cfg, tmp_path / "data-c", keys, "CONFIRMED", WAIT)


def _worker_pid(link_pid: int) -> int:
    """The worker: the link process's child, inside the namespace."""
    children = Path(f"/proc/{link_pid}/task/{link_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.timeout(600)
def test_a_worker_stopped_while_its_batch_is_unacknowledged_does_not_commit_it(
    kafka_config: KafkaConfig, tmp_path: Path, socket_dir: str
) -> None:
    """A worker told to stop (SIGTERM) while Kafka has not acknowledged the batch it is writing,
    whose records then never arrive: its events must not be committed, so the next worker folds
    them. The worker waits for the batch (``--drain-timeout``, 3 s here), then faust cancels the
    fold; the batch's ``take_events`` used to acknowledge every event on its way out, and the
    consumer committed what was acknowledged: the next worker started past the Executed events and
    every key stayed PENDING."""
    cfg = kafka_config
    # each key: its intent and executed events
    link, a, keys, events, expected = linked(cfg, tmp_path / "data-a", socket_dir, "executed", drain_s=3)
    write = write_each(RawProducer(cfg), keys, events)

    with TopicReader(cfg, cfg.topics.state) as states:
        with running(a):
            write(0)
            wait_for(lambda: not mismatches(states, {k: to_state(fold(events[k][:1])) for k in keys}), WAIT,  # type: ignore[arg-type]
                     "worker A to fold every key's intent")  # fmt: skip
            wait_for(lambda: committed_through_end(cfg), WAIT, "the group to commit the intents")
            link.hold(CLIENT_ID)
            write(1)
            assert link.holding.wait(WAIT), "A did not write its batch of Executed events"
            assert a.proc is not None
            os.kill(_worker_pid(a.proc.pid), signal.SIGTERM)  # the worker only: its link stays
            wait_for(lambda: not a.alive, 60, "worker A to stop")
            link.cut()  # what A sent and Kafka never acknowledged is gone
        # Each partition's last record is a key's Executed event: none may be committed.
        ahead = {p: (c, end) for p, (c, end) in commits(cfg).items() if c >= end}
        assert not ahead, f"the group committed events whose fold never reached Kafka: {ahead}"
        b = Processor(cfg, tmp_path / "data-b")
        with running(b):
            b.wait_ready(WAIT)
            try:
                wait_for(lambda: not mismatches(states, expected), 60, "every key's state to be its single fold")
            except TimeoutError as e:
                raise AssertionError(f"{e}: {describe(mismatches(states, expected))}") from None
