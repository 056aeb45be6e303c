"""A worker the group no longer counts as a member must not fold: its partitions are another
worker's, and what it writes lands in their changelog and effects.state after the owner's.

Worker A folds every key's intent. Then the group's coordinator stops hearing from A: its group
requests (heartbeat, join, sync, offset commit) wait in the link while its fetches and writes still
go through, as on a host cut off from the coordinator alone, or healed before the heartbeat sent
during the cut comes back (aiokafka waits for it up to the request timeout, 90 s). A's session
expires and worker B is given every partition. The Executed events and Receipts are then written: B
folds them. A, still believing it owns its partitions, fetched them and folded them too, writing
its table values after B's (seen in the 30-minute chaos run: the rebuilt table lacked three
receipts, the group's commit was past them, and the keys were escalated). A worker now folds only
while the group confirmed it a member recently enough that its session cannot have expired
(``faust_internals.Membership``); otherwise it holds the fold until it hears, or loses the
partitions. Checked before the fix: A wrote to Kafka while B owned everything."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from effect_ledger.processors.faust_settings import SESSION_TIMEOUT_S
from effect_ledger.streams.config import KafkaConfig
from tests.faults import broker_link
from tests.faults._flow import committed_through_end, published, rebuilt, settled, write_each
from tests.faults.test_revoked_in_flight import WAIT, linked, socket_dir  # noqa: F401
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, running

pytestmark = pytest.mark.skipif(not broker_link.available(), reason="needs a network namespace (unshare -n)")

PRODUCE = 0
#: The consumer group's requests, which go to the group's coordinator on a connection of their own.
GROUP_REQUESTS = frozenset(
    {8, 9, 11, 12, 13, 14}
)  # OffsetCommit, OffsetFetch, JoinGroup, Heartbeat, LeaveGroup, SyncGroup
#: A's log line when it holds its fold (the fix's).
HELD = "holding the fold"


@pytest.mark.timeout(600)
def test_a_worker_whose_session_expired_writes_nothing_while_another_owns_its_partitions(
    kafka_config: KafkaConfig,
    tmp_path: Path,
    socket_dir: str,  # noqa: F811
) -> None:
    cfg = kafka_config
    # each key: its intent, executed and receipt events
    link, a, keys, events, expected = linked(cfg, tmp_path / "data-a", socket_dir, "confirmed")
    b = Processor(cfg, tmp_path / "data-b")
    write = write_each(RawProducer(cfg), keys, events)

    with TopicReader(cfg, cfg.topics.state) as states, running(a):
        write(0)
        wait_for(lambda: published(states, keys, "PENDING"), WAIT, "worker A to fold every key's intent")
        link.hold_requests(GROUP_REQUESTS)
        held_at = time.monotonic()
        with running(b):
            everything = set(range(cfg.partitions))

            def b_owns_everything() -> bool:
                h = b.health() or {}
                return bool(h.get("ready")) and set(h.get("partitions") or ()) == everything

            wait_for(b_owns_everything, WAIT, "worker B to be given every partition (A's session expired)")
            assert time.monotonic() - held_at >= SESSION_TIMEOUT_S * 0.9, (
                "B owned everything before A's session ran out"
            )
            before = link.count(PRODUCE)
            write(1)
            write(2)
            wait_for(lambda: published(states, keys, "CONFIRMED"), WAIT, "worker B to fold every key's receipt")
            # A fetched them too (its fetches go through): it folds them and writes (before the fix),
            # or says it holds its fold.
            wait_for(lambda: link.count(PRODUCE) > before or HELD in a.log(), WAIT, "worker A to fold or hold")
            # A keeps holding, whatever its timer and its fetches do meanwhile, at least until B has
            # committed every event (A's own commits are held with its other group requests).
            wait_for(lambda: link.count(PRODUCE) > before or committed_through_end(cfg), WAIT, "B to commit")
            wrote = link.count(PRODUCE) - before
            assert wrote == 0, (
                f"worker A, no longer a member of the group, sent {wrote} produce request(s) while B owned "
                f"every partition:\n{a.log()[-3000:]}"
            )
            link.release_requests()  # A hears it lost its membership, rejoins and gets partitions back

            settled(cfg, states, expected, WAIT)
    rebuilt(cfg, tmp_path / "data-c", keys, "CONFIRMED", WAIT)


def test_the_link_reads_each_requests_api_key_however_the_reads_cut_them() -> None:
    """The hold above relies on it: requests (a 4-byte size, then the API key) split anywhere."""
    import struct

    def request(key: int, body: bytes) -> bytes:
        payload = struct.pack(">h", key) + body
        return struct.pack(">i", len(payload)) + payload

    stream = request(12, b"x" * 30) + request(1, b"") + request(0, b"y" * 7) + request(14, b"z")
    for cut in range(1, len(stream)):
        frames = broker_link.Frames()
        assert frames.feed(stream[:cut]) + frames.feed(stream[cut:]) == [12, 1, 0, 14], cut
    frames = broker_link.Frames()
    assert [k for i in range(len(stream)) for k in frames.feed(stream[i : i + 1])] == [12, 1, 0, 14]
