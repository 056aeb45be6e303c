"""A worker whose connection to the group's coordinator went silent finds the coordinator again
within its session, and keeps its partitions.

After a cut heals, or when the coordinator moves to another broker, the TCP connection a worker's
heartbeat went out on can stay silent: the request sent into the cut is retransmitted with a
growing backoff and its answer comes 13-43 s after the heal (seen in the chaos runs), while a new
connection would go through at once. aiokafka waits for that answer up to the request timeout
(90 s), sending no other heartbeat meanwhile, so the coordinator expired the worker's session: its
partitions went to another worker, a rebalance and a table recovery later, and the worker held its
fold the whole time (``faust_internals.Membership``). Now a heartbeat unanswered after
``HEARTBEAT_WAIT_S`` drops the connection and the coordinator is looked up again
(``faust_internals.confirm_membership``), and no other request of the worker's consumer waits past
``REQUEST_WAIT_S`` (``faust_internals.bound_requests``).

Worker A folds every key's intent, alone in its group. Then every group request on the connections
open at that moment waits in the link, while new connections go through. The executed events and
receipts are written; A must fold them without the group rebalancing. Checked before the fix (both
waits set to 1,000 s): A's session expired, it folded nothing until it rejoined the group."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from effect_ledger.processors.faust_settings import HEARTBEAT_WAIT_S, SESSION_TIMEOUT_S, throughput_settings
from effect_ledger.streams.config import KafkaConfig
from tests.faults import broker_link
from tests.faults._flow import published, settled, write_each
from tests.faults.test_expired_member import GROUP_REQUESTS
from tests.faults.test_revoked_in_flight import WAIT, linked, socket_dir  # noqa: F401
from tests.services import wait_for
from tests.topic_io import RawProducer, TopicReader, running

pytestmark = pytest.mark.skipif(not broker_link.available(), reason="needs a network namespace (unshare -n)")

HEARTBEAT = 12
HEARTBEAT_INTERVAL_S = throughput_settings()["broker_heartbeat_interval"]
#: A's log lines at each rebalance, and when it gives up on a heartbeat (the fix's).
ASSIGNED, REVOKED = "partitions assigned:", "partitions revoked:"
GAVE_UP = "looking the coordinator up again"


@pytest.mark.timeout(600)
def test_a_worker_whose_coordinator_connection_went_silent_keeps_its_partitions(
    kafka_config: KafkaConfig,
    tmp_path: Path,
    socket_dir: str,  # noqa: F811
) -> None:
    cfg = kafka_config
    # each key: its intent, executed and receipt events
    link, a, keys, events, expected = linked(cfg, tmp_path / "data-a", socket_dir, "confirmed")
    write = write_each(RawProducer(cfg), keys, events)

    with TopicReader(cfg, cfg.topics.state) as states, running(a):
        write(0)
        wait_for(lambda: published(states, keys, "PENDING"), WAIT, "worker A to fold every key's intent")
        rebalances = (a.log().count(ASSIGNED), a.log().count(REVOKED))
        link.hold_requests(GROUP_REQUESTS, open_only=True)
        held_at = time.monotonic()
        wait_for(link.holding_requests.is_set, WAIT, "A's next group request to wait on its open connection")
        beats = link.count(HEARTBEAT)
        # Heartbeats of A through new connections for longer than a session since the hold: had
        # none of them reached the coordinator in time, the group would have rebalanced meanwhile.
        enough = beats + int(SESSION_TIMEOUT_S / HEARTBEAT_INTERVAL_S) + 1
        wait_for(lambda: link.count(HEARTBEAT) >= enough, WAIT, "A's heartbeats to go through again")
        write(1)
        write(2)
        wait_for(lambda: published(states, keys, "CONFIRMED"), WAIT, "worker A to fold every key's receipt")
        log = a.log()
        assert (log.count(ASSIGNED), log.count(REVOKED)) == rebalances, (
            f"A's session expired and the group rebalanced ({time.monotonic() - held_at:.1f} s after the "
            f"hold; session {SESSION_TIMEOUT_S} s, heartbeat wait {HEARTBEAT_WAIT_S} s):\n{log[-3000:]}"
        )
        assert GAVE_UP in log, f"A's heartbeat went through without giving up on the held one:\n{log[-3000:]}"
        link.release_requests()
        settled(cfg, states, expected, WAIT)
