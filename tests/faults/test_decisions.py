"""Fault: a person's decision causes a second execution (issue 10, item 3).

``effects resolve KEY --absent`` while the attempt may still land at the destination tells agents
that nothing happened; the next agent executes again, and the destination pays twice. The pins:

* ``resolve --absent`` (Kafka and embedded) and ``Ledger.decide`` refuse ABSENT while the attempt is
  PENDING/EXECUTED or before its deadline + grace: one line on stderr, exit 1, nothing written;
* the fold ignores an ABSENT decision made before the attempt's deadline, so a decision written
  straight onto a topic cannot cause a re-execution either: an agent on another host does not pay
  again;
* decisions go to their own topic (``effects.decisions``, which Kafka ACLs can keep to operators),
  carry the writer's identity, and a Decision on ``effects.events`` is not folded.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from effect_ledger.core.effect import fold
from effect_ledger.core.model import (
    DeadLetter,
    Decision,
    DecisionKind,
    Executed,
    Flag,
    Intent,
    Outcome,
    State,
    Timeout,
    TimeoutPhase,
)
from effect_ledger.core.reconcile import Target
from effect_ledger.demo.gateway import Gateway
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.admin import list_topics
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, recorded_times, run_agent, running

WAIT = 60.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def intent(key: str, at: int, deadline: int) -> Intent:
    return Intent(
        f"i-{uuid.uuid4().hex}", key, at, 1, "payments", "refund.create", "default", "run-1", "step-1",
        '{"amount":100}', "d" * 64, deadline, "some-host:1:1:x",
    )  # fmt: skip


def resolve(cfg: KafkaConfig, key: str, *flags: str) -> Any:
    return CliRunner().invoke(
        main,
        ["resolve", key, *flags, "--by", "alice", "--reason", "not in the books",
         "--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix],
    )  # fmt: skip


def records_of(cfg: KafkaConfig, topic: str, key: str) -> list[Any]:
    with TopicReader(cfg, topic) as r:
        r.drain()
        return [rec.value for rec in r.records if rec.key == key.encode()]


# -- where the decision is made --------------------------------------------------------------------


def test_resolve_absent_is_refused_while_the_attempt_may_still_land(kafka_config: KafkaConfig) -> None:
    """An uncertain call whose deadline is ten minutes away: ``resolve --absent`` is refused with one
    line and exit 1, and no decision reaches Kafka. Before the fix it was written, and the next
    agent executed again."""
    cfg = kafka_config
    key = "payments:in-flight"
    t = now_ms()
    p = RawProducer(cfg)
    p.event(intent(key, t, t + 600_000))
    p.event(Executed(f"x-{uuid.uuid4().hex}", key, t + 5, 1, Outcome.UNKNOWN, "connection reset", t, t + 5, None, "w"))
    p.flush()

    r = resolve(cfg, key, "--absent")
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"effects: decision on {key} refused: "), r.output
    assert "may still land" in lines[0]
    topics = list_topics(cfg)
    for topic in (cfg.topics.events, f"{cfg.prefix}effects.decisions"):
        if topic in topics:
            assert not [v for v in records_of(cfg, topic, key) if isinstance(v, Decision)], topic

    # Deciding something that cannot cause an execution is not refused.
    r = resolve(cfg, key, "--abandon")
    assert r.exit_code == 0, r.output


def test_resolve_absent_in_embedded_mode_is_refused_while_the_call_may_land(tmp_path: Path) -> None:
    """The same rule on a ledger file: a call cut off a moment ago may still land for its timeout."""
    db = tmp_path / "agent.db"

    def reset(_key: str) -> Any:
        raise ConnectionResetError("connection reset by peer")

    async def cut_off() -> str:
        async with await Ledger.open(str(db), targets=[Target("payments")]) as ledger:
            with pytest.raises(EffectUncertain) as info:
                await ledger.execute(
                    target="payments", operation="refund.create", run_id="r", step="s", request={"a": 1},
                    call=reset, timeout=300,
                )  # fmt: skip
            return info.value.effect_id

    key = asyncio.run(cut_off())
    r = CliRunner().invoke(main, ["resolve", key, "--db", str(db), "--absent", "--by", "a", "--reason", "r"])
    assert r.exit_code == 1, r.output
    assert r.output.startswith(f"effects: decision on {key} refused: ") and r.output.count("\n") == 1, r.output

    async def state() -> tuple[State, int]:
        async with await Ledger.open(str(db), targets=[Target("payments")]) as ledger:
            e = await ledger.get(key)
            assert e is not None
            return e.state, e.version

    assert asyncio.run(state()) == (State.UNCERTAIN, 2)  # nothing was written


@pytest.mark.parametrize("where", ["file", "kafka"])
def test_resolve_absent_is_refused_for_the_declared_lands_within(
    where: str, tmp_path: Path, kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline passed 5 s ago. The default lands_within (2 s) has passed, the declared one
    (30 s) has not: with the declaration, ``--absent`` is refused; it did not read one before (a
    review found ``resolve`` used the default 2 s whatever the target declared)."""
    monkeypatch.delenv("EFFECTS_TARGETS", raising=False)
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.payments]\nlookup = "none"\nlands_within = "30s"\n')
    t = now_ms()
    key = f"payments:{where}-{uuid.uuid4().hex[:8]}"
    cut_off = Executed(
        f"x-{uuid.uuid4().hex}", key, t - 9_000, 1, Outcome.UNKNOWN, "reset", t - 9_100, t - 9_000, None, "w"
    )
    where_flags: list[str]
    if where == "kafka":
        recorded_times(kafka_config)  # the test writes a history (a deadline 5 s ago): its records keep their times
        p = RawProducer(kafka_config)
        p.event(intent(key, t - 10_000, t - 5_000))
        p.event(cut_off)
        p.flush()
        where_flags = ["--bootstrap", kafka_config.bootstrap, "--prefix", kafka_config.prefix]
    else:
        db = tmp_path / "agent.db"

        async def write() -> None:
            async with await Ledger.open(str(db), targets=[Target("payments")]) as ledger:
                await ledger.store.append(None, [intent(key, t - 10_000, t - 5_000), cut_off], now_ms=t)

        asyncio.run(write())
        where_flags = ["--db", str(db)]

    def resolve_absent(*more: str) -> Any:
        args = ["resolve", key, "--absent", "--by", "alice", "--reason", "r", *where_flags, *more]
        return CliRunner().invoke(main, args)

    r = resolve_absent("--targets", str(targets))
    assert r.exit_code == 1, r.output
    assert "may still land" in r.output and r.output.count("\n") == 1, r.output
    r = resolve_absent()  # without the declaration: the default 2 s, long past
    assert r.exit_code == 0, r.output


# -- the fold ------------------------------------------------------------------------------------------


def test_fold_ignores_an_absent_decision_made_before_the_deadline() -> None:
    """A decision slipped past the check: made while the call could still land, it is kept as a fact
    and flagged, but the effect does not become ABSENT, in any order of arrival."""
    key = "payments:k"
    i = intent(key, 1_000, 60_000)
    x = Executed("x", key, 2_000, 1, Outcome.UNKNOWN, "eof", 1_000, 2_000, None, "w")
    early = Decision("d-early", key, 30_000, 1, DecisionKind.ABSENT, "mallory", "sure")
    for events in ([i, x, early], [early, x, i], [x, early, i]):
        e = fold(events)
        assert e is not None and e.state is State.UNCERTAIN, events
        assert Flag.DECISION_IGNORED in e.flags and e.has("d-early")
        assert e.reason is not None and "ignored" in e.reason
    # Still early within the 2 s an intent without lands_within may land after its deadline.
    grace = Decision("d-grace", key, 61_999, 1, DecisionKind.ABSENT, "alice", "checked")
    e = fold([i, x, early, grace])
    assert e is not None and e.state is State.UNCERTAIN
    on_time = Decision("d-late", key, 62_000, 1, DecisionKind.ABSENT, "alice", "checked")
    e = fold([i, x, early, on_time])
    assert e is not None and e.state is State.ABSENT


# -- on the topics, end to end ------------------------------------------------------------------------


def test_an_absent_decision_written_straight_to_the_topics_cannot_make_another_host_pay_again(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """An agent pays (a gateway that neither deduplicates nor can be asked) and dies before recording
    it; its deadline is ten minutes away. Someone writes ABSENT straight onto the topics, past
    ``effects resolve``. An agent on another host then runs the same step: it must not pay again.
    Before the fix the decision made the effect ABSENT and the second agent paid: two refunds."""
    cfg = kafka_config
    proc = Processor(cfg, tmp_path / "data")
    with Gateway("none") as gw, running(proc):
        proc.wait_ready()
        first = run_agent(
            cfg, tmp_path / "host-1", gw.url, "after_call", run_id="order-9", timeout=600, extra=["--kind", "none"]
        )
        out, _ = first.communicate(timeout=WAIT)
        assert first.returncode == -9, out.decode(errors="replace")
        (refund,) = gw.refunds()
        key = refund.idempotency_key
        assert key is not None

        d = Decision(uuid.uuid4().hex, key, now_ms(), 1, DecisionKind.ABSENT, "mallory", "looks absent to me")
        p = RawProducer(cfg)
        decisions_topic = f"{cfg.prefix}effects.decisions"
        topics = [t for t in (cfg.topics.events, decisions_topic) if t in list_topics(cfg)]
        for topic in topics:
            p.event(d, topic)
        p.flush()
        wait_for(
            lambda: (r := proc.lookup(key))[0] == 200 and d.event_id in _event_ids(r[1]),
            WAIT,
            "the processor to fold the decision",
        )

        second = run_agent(
            cfg, tmp_path / "host-2", gw.url, "", run_id="order-9", timeout=600,
            extra=["--kind", "none", "--lookup", proc.url, "--patience", "2"],
        )  # fmt: skip
        out, _ = second.communicate(timeout=WAIT)
        answer = json.loads(out.decode().strip().splitlines()[-1])
        assert len(gw.refunds()) == 1, f"the second agent paid again: {answer}"
        assert answer["result"] in ("uncertain", "in_progress"), answer

        status, body = proc.lookup(key)
        assert status == 200 and body["state"] != State.ABSENT.value, body
        with TopicReader(cfg, cfg.topics.state) as states:
            st = states.until(lambda _r: states.latest().get(key), WAIT, "the key's state")
            assert Flag.DECISION_IGNORED.value in st.flags, st
        # The copy on effects.events is not folded: decisions are read from their own topic only.
        with TopicReader(cfg, cfg.topics.dlq) as dlq:
            letters = dlq.until(
                lambda rs: [r.value for r in rs if isinstance(r.value, DeadLetter) and r.key == key.encode()],
                WAIT,
                "the dead letter of the decision on effects.events",
            )
            assert "decisions are read from the decisions topic only" in letters[0].error


def _event_ids(body: dict[str, Any]) -> set[str]:
    import base64

    codec = default_codec()
    return {codec.decode(base64.b64decode(e)).event_id for e in body.get("events", [])}


# -- who may decide, and who did -----------------------------------------------------------------------


def test_resolve_writes_to_the_decisions_topic_with_the_writers_identity(kafka_config: KafkaConfig) -> None:
    """Once the deadline has passed (the processor timed the call out), ``resolve --absent`` is
    accepted; the decision goes to ``effects.decisions`` (not ``effects.events``, which every agent
    may write), on the key's partition, and names the OS user who wrote it beside ``--by``."""
    cfg = kafka_config
    recorded_times(cfg)  # the test writes a history (ten minutes ago): its records keep their times
    key = "payments:timed-out"
    t = now_ms() - 600_000
    p = RawProducer(cfg)
    i = intent(key, t, t + 30_000)
    p.event(i)
    p.event(Timeout(f"timeout:call:1:{key}", key, t + 31_000, 1, TimeoutPhase.CALL, t + 30_000))
    p.flush()

    r = resolve(cfg, key, "--absent")
    assert r.exit_code == 0, r.output
    assert f"written to {cfg.prefix}effects.decisions" in r.output
    assert not [v for v in records_of(cfg, cfg.topics.events, key) if isinstance(v, Decision)]
    with TopicReader(cfg, f"{cfg.prefix}effects.decisions") as decisions:
        recs = decisions.until(lambda rs: [x for x in rs if x.key == key.encode()], WAIT, "the decision")
    (rec,) = recs
    assert rec.partition == partition_for(key.encode(), cfg.partitions)
    d = rec.value
    assert isinstance(d, Decision)
    assert (d.decision, d.by, d.attempt) == (DecisionKind.ABSENT, "alice", 1)
    assert d.principal == f"os:{getpass.getuser()}@{socket.gethostname()}"
