"""Every key's events delivered out of order (executed or receipt before the intent) and
each one twice, split over two workers' lifetimes (the first one SIGKILLed, with or without its
group's commits; the second with its data dir or an empty one). The state every key ends in must
equal a single in-order fold (``streams.effect.fold``)."""

from __future__ import annotations

import dataclasses
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.effect import expire, fold, to_state
from effect_ledger.core.model import Executed, Flag, Intent, Outcome, Receipt, ReceiptSource, Resolution, Verdict
from effect_ledger.streams.config import KafkaConfig
from tests.faults._flow import committed_through_end, describe, forget_commits
from tests.faults._flow import intent as intent_at
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, recorded_times, running, untimed

WAIT = 120.0


def history(key: str, t: int, shape: int) -> list[object]:
    far = t + 3_600_000

    def intent(a: int) -> Intent:
        return intent_at(key, t + 10 * a, far, a)

    if shape == 0:  # one attempt, confirmed
        return [intent(1), Executed(f"x1-{uuid.uuid4().hex}", key, t + 11, 1, Outcome.OK, None, t, t + 11, far, "w"),
                Receipt(f"r1-{uuid.uuid4().hex}", key, t + 12, 1, f"re_{key}", ReceiptSource.CALL, "{}")]  # fmt: skip
    if shape == 1:  # unknown, absent (once attempt 1 can no longer land), second attempt confirmed
        return [
            dataclasses.replace(intent_at(key, t + 10, t + 10, 1), lands_within_ms=0),
            Executed(f"x1-{uuid.uuid4().hex}", key, t + 11, 1, Outcome.UNKNOWN, "timeout", t, t + 11, None, "w"),
            Resolution(f"s1-{uuid.uuid4().hex}", key, t + 13, 1, Verdict.ABSENT, "rec", "never"),
            intent(2),
            Executed(f"x2-{uuid.uuid4().hex}", key, t + 21, 2, Outcome.OK, None, t + 20, t + 21, far, "w"),
            Receipt(f"r2-{uuid.uuid4().hex}", key, t + 22, 2, f"re_{key}", ReceiptSource.CALL, "{}"),
        ]
    if shape == 2:  # executed, no receipt yet
        return [intent(1), Executed(f"x1-{uuid.uuid4().hex}", key, t + 11, 1, Outcome.OK, None, t, t + 11, far, "w")]
    return [intent(1)]  # pending


def same(state: Any) -> Any:
    """A state record as a single fold of the events gives it: without its times, and without
    LOST_CLAIM, which the processor's claim verdicts add when attempt 2's intent reaches it before
    attempt 1's ABSENT (shuffled: the log refuses attempt 2 then; its receipt confirms the effect all
    the same)."""
    s = untimed(state)
    if s is None:
        return None
    return dataclasses.replace(s, flags=tuple(f for f in s.flags if f != Flag.LOST_CLAIM.value))


def accepted(events: list[object], until_ms: int) -> list[Any]:
    """The states a processor may publish for these events: their single fold, and for a key whose
    first attempt can time out (shape 1: its deadline is past when it is written) the same fold with
    the processor's own timeout of that attempt. The timer proposes it when it ticks between folding
    attempt 1's intent and the next event of the key (they can arrive in different batches); it is a
    fact like any other (deterministic id, folded once) and raises the version by one."""
    single = to_state(fold(events))  # type: ignore[arg-type]
    first = fold(events[:1])  # type: ignore[arg-type]
    assert first is not None
    timeouts = expire(first, until_ms) if len(events) > 1 else []  # deadlines past before the test ends
    return [single] + [to_state(fold([*events, *timeouts]))] * bool(timeouts)  # type: ignore[list-item]


def differing(states: TopicReader, expected: dict[str, list[Any]]) -> dict[str, Any]:
    """The keys whose published state is none of the accepted ones (compared through ``same``)."""
    states.poll()
    latest = states.latest()
    return {k: (latest.get(k), ok[0]) for k, ok in expected.items()
            if same(latest.get(k)) not in [same(s) for s in ok]}  # fmt: skip


def _forgot(cfg: KafkaConfig) -> bool:
    try:
        forget_commits(cfg)
        return True
    except Exception as e:  # NON_EMPTY_GROUP until the killed member's session expires
        if "NON_EMPTY_GROUP" in str(e):
            time.sleep(1)
            return False
        raise


@pytest.mark.parametrize("commits", [True, False], ids=["with-commits", "without-commits"])
@pytest.mark.parametrize("data", ["same-dir", "empty-dir"])
def test_duplicated_reordered_events_across_a_restart_fold_like_one_in_order_fold(
    kafka_config: KafkaConfig, tmp_path: Path, commits: bool, data: str
) -> None:
    # The histories are written with their writers' times (the processor folds on them, as on a topic
    # that keeps the producer's time): attempt 1 of shape 1 ends at t+10, so its ABSENT at t+13 counts.
    recorded_times(kafka_config)
    rnd = random.Random(11)
    t = time.time_ns() // 1_000_000  # deadlines an hour on, but shape 1's attempt 1 (see accepted)
    evs = {f"payments:dup-{i}": history(f"payments:dup-{i}", t + i, i % 4) for i in range(80)}
    expected = {k: accepted(v, t + 600_000) for k, v in evs.items()}
    # Each key's events, shuffled, each twice; the first part goes to the first worker.
    first_part: list[object] = []
    second_part: list[object] = []
    for v in evs.values():
        order = list(v) + list(v)
        rnd.shuffle(order)
        cut = rnd.randint(1, len(order) - 1)
        first_part += order[:cut]
        second_part += order[cut:]
    producer = RawProducer(kafka_config)
    first = Processor(kafka_config, tmp_path / "data-1")
    with running(first), TopicReader(kafka_config, kafka_config.topics.state) as states:
        first.wait_ready()
        for ev in first_part:
            producer.event(ev)
        producer.flush()
        wait_for(lambda: committed_through_end(kafka_config), WAIT, "the group to commit")
        first.kill()
        if not commits:
            # The killed member stays in the group until its session times out (10 s).
            wait_for(lambda: _forgot(kafka_config), WAIT, "the group to be empty and deleted")
        if data == "empty-dir":
            shutil.rmtree(tmp_path / "data-1")
        for ev in second_part:
            producer.event(ev)
        producer.flush()
        second = Processor(kafka_config, tmp_path / "data-1")
        with running(second):
            second.wait_ready()
            try:
                wait_for(lambda: not differing(states, expected), WAIT, "every key's state to equal a single fold")
            except TimeoutError as e:
                raise AssertionError(f"{e}: {describe(differing(states, expected))}") from None
            wrong = {}
            latest = states.latest()
            for k in expected:
                want = latest[k]  # one of the accepted states, checked above
                status, body = second.lookup(k)
                if status != 200 or body.get("state") != want.state.value or body.get("version") != want.version:
                    wrong[k] = (status, body.get("state"), body.get("version"), want.state.value, want.version)
            assert not wrong, f"{len(wrong)} lookups differ, e.g. {list(wrong.items())[:5]}"
