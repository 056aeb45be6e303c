"""``effects worker --processes 2``: two worker processes on one machine, one consumer group,
sharing the partitions (each owns some), folding every key once, each answering lookups for any
key; SIGTERM to the parent stops both."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from effect_ledger.core.effect import fold, to_state
from effect_ledger.core.model import Outcome, State
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.integration.test_processor import WAIT, executed, intent, receipt, states_match
from tests.services import Processor, Service, free_port, wait_for
from tests.topic_io import RawProducer, TopicReader, running


def two_free_ports() -> int:
    """A port P with P + 1 free too (the pool's workers listen on P and P + 1)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def test_processes_share_the_partitions_and_answer_lookups(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    port = two_free_ports()
    data = tmp_path / "data"
    pool = Service(
        ["worker", "--bootstrap", kafka_config.bootstrap, "--prefix", kafka_config.prefix,
         "--partitions", str(kafka_config.partitions), "--data-dir", str(data), "--web-port", str(port),
         "--loglevel", "info", "--processes", "2"],
        tmp_path / "pool.log",
    )  # fmt: skip
    # Handles on each worker's view (not started: the pool runs them).
    workers = [Processor(kafka_config, data / f"worker-{i}", port=port + i) for i in range(2)]
    every = set(range(kafka_config.partitions))
    with running(pool), TopicReader(kafka_config, kafka_config.topics.state) as states:

        def split() -> list[set[int]] | None:
            assert pool.alive, pool.log()[-3000:]
            hs = [w.health() for w in workers]
            if not all(h and h["ready"] for h in hs):
                return None
            parts = [set(h["partitions"]) for h in hs if h]
            return parts if all(parts) and not parts[0] & parts[1] and parts[0] | parts[1] == every else None

        parts = wait_for(split, WAIT * 2, "both workers ready, owning disjoint partitions that cover all")
        producer = RawProducer(kafka_config)
        far = int(time.time() * 1000) + 3_600_000
        keys = [f"payments:pool-{i}" for i in range(30)]
        evs = {k: [intent(k, far), executed(k, Outcome.OK), receipt(k)] for k in keys}
        for k in keys:
            for ev in evs[k]:
                producer.event(ev)
        producer.flush()
        assert {partition_for(k.encode(), kafka_config.partitions) for k in keys} & parts[0]
        assert {partition_for(k.encode(), kafka_config.partitions) for k in keys} & parts[1]
        want = {k: to_state(e) for k, e in ((k, fold(v)) for k, v in evs.items()) if e is not None}
        assert all(s.state is State.CONFIRMED for s in want.values())
        wait_for(lambda: states_match(states, want), WAIT, "effects.state to equal a single fold per key")
        for w in workers:  # either worker answers for any key (forwarded to the owner)
            for k in keys[:6]:
                status, body = w.lookup(k)
                assert (status, body.get("state"), body.get("version")) == (200, "CONFIRMED", 3), body
        pool.stop()
        assert pool.proc is not None and pool.proc.returncode == 0, pool.log()[-3000:]
        for w in workers:
            assert w.health() is None  # stopped with the parent
