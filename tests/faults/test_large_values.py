"""A key whose events add up to more than a Kafka record (two attempts' 250 KB requests, a 250 KB
receipt and a reconciler's 250 KB copy of it: ~1 MB). The processor's table value used to be every
event of the key concatenated: its changelog send failed, the worker exited, and a table rebuilt
from the changelog disagreed with the agent's ledger. The value is now bounded
(processors/table_value.py): the worker folds the key, and a worker that rebuilds its table from the
changelog alone answers the same state and receipt as a fresh fold of the events."""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path

from effect_ledger.core.effect import fold, to_state
from effect_ledger.core.limits import MAX_RECEIPT_BYTES, MAX_REQUEST_BYTES
from effect_ledger.core.model import (
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    Verdict,
)
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.faults._flow import committed_through_end
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, recorded_times, running, untimed

WAIT = 90.0


def big(n: int, fill: str) -> str:
    return json.dumps({"blob": fill * (n - 100)})


def events_of(key: str) -> list[object]:
    t = time.time_ns() // 1_000_000
    far = t + 3_600_000

    def intent(attempt: int, fill: str, deadline: int = far, lands_within_ms: int | None = None) -> Intent:
        return Intent(f"i-{attempt}-{uuid.uuid4().hex}", key, t + attempt, attempt, "payments", "refund.create",
                      "tests", "run-1", key, big(MAX_REQUEST_BYTES, fill), "d" * 64, deadline, "w", True,
                      lands_within_ms)  # fmt: skip

    return [
        intent(1, "a", t + 1, 0),  # its call could land no later than t+1: the ABSENT at t+3 counts
        Executed(f"x-1-{uuid.uuid4().hex}", key, t + 2, 1, Outcome.UNKNOWN, "timeout", t, t + 1, None, "w"),
        Resolution(f"res-1-{uuid.uuid4().hex}", key, t + 3, 1, Verdict.ABSENT, "rec", "never happened"),
        intent(2, "b"),
        Executed(f"x-2-{uuid.uuid4().hex}", key, t + 5, 2, Outcome.OK, None, t + 4, t + 5, far, "w"),
        Receipt(f"rc-2-{uuid.uuid4().hex}", key, t + 6, 2, "re_big", ReceiptSource.CALL, big(MAX_RECEIPT_BYTES, "c")),
        Resolution(
            f"res-2-{uuid.uuid4().hex}", key, t + 7, 2, Verdict.FOUND, "rec", "", "re_big", big(MAX_RECEIPT_BYTES, "c")
        ),  # fmt: skip
    ]


def test_a_key_larger_than_a_record_folds_and_recovers_from_the_changelog(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    key = "payments:large-values"
    small = [f"payments:small-{i}" for i in range(5)]
    evs = events_of(key)
    expected = fold(evs)  # type: ignore[arg-type]
    assert expected is not None and expected.state is State.CONFIRMED
    assert sum(len(default_codec().encode(e)) for e in evs) > 1_000_000  # more than one Kafka record

    recorded_times(kafka_config)  # the history is folded with its writers' times
    producer = RawProducer(kafka_config)
    for ev in evs:
        producer.event(ev)
    for k in small:  # other keys of the same partitions go on being folded
        producer.event(events_of(k)[0])
    producer.flush()
    assert not producer.errors, producer.errors

    first = Processor(kafka_config, tmp_path / "data-1")
    with running(first), TopicReader(kafka_config, kafka_config.topics.state) as states:
        first.wait_ready()

        def folded() -> bool:
            assert first.alive, f"the worker exited:\n{first.log()[-3000:]}"
            states.poll()
            latest = states.latest()
            return untimed(latest.get(key)) == untimed(to_state(expected)) and all(k in latest for k in small)

        wait_for(folded, WAIT, "the large key and the others folded")
        assert first.alive, first.log()[-3000:]
        # The group commits what it folded before this worker stops, so the one below starts with
        # its table alone (the changelog) and nothing to fold again: what it answers is the table.
        wait_for(lambda: committed_through_end(kafka_config), WAIT, "the group to commit every record")

    # A new worker with an empty data dir: its table comes from the changelog alone.
    second = Processor(kafka_config, tmp_path / "data-2")
    with running(second):
        second.wait_ready()
        # Ready once the table is recovered; until it knows the group's committed offsets a lookup
        # says it is lagging (503) rather than guess.
        answers: list[tuple[int, dict]] = []  # type: ignore[type-arg]

        def answered() -> bool:
            answers.append(second.lookup(key))
            return answers[-1][0] != 503

        try:
            wait_for(answered, WAIT, "the rebuilt worker to answer the lookup")
        except TimeoutError as e:  # say what the worker was doing
            raise AssertionError(f"{e}; last answer {answers[-1:]}; worker log:\n{second.log()[-6000:]}") from None
        status, body = answers[-1]
        assert status == 200, body
        codec = default_codec()
        recovered = fold([codec.decode(base64.b64decode(e)) for e in body["events"]])
        assert recovered is not None
        assert untimed(to_state(recovered)) == untimed(to_state(expected))
        assert recovered.receipt == expected.receipt  # the receipt value, whole
        assert recovered.intent == expected.intent  # the latest request, whole (reconcilers need it)
        assert body["state"] == "CONFIRMED" and body["receipt_id"] == "re_big"
