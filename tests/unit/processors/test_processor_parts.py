"""The processor's pure parts: the deadline index, the batch fold of one key, the lookup route.
Time is passed in (or a fake clock injected); no faust, no broker."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import faust

from effect_ledger.core.effect import Effect, fold
from effect_ledger.core.model import Executed, Intent, Outcome, Receipt, ReceiptSource, State, UncertainEffect
from effect_ledger.processors.batch import fold_key, group_by_key
from effect_ledger.processors.deadline_index import RESEND_AFTER_MS, DeadlineIndex, due_of
from effect_ledger.processors.lookup_route import LookupRoute, authorized
from effect_ledger.processors.table_value import TableValueTooLarge
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.partition import partition_for

KEY = "payments:k"
T = 1_700_000_000_000


def intent(key: str = KEY, eid: str = "i-1", deadline: int = T + 10_000) -> Intent:
    return Intent(eid, key, T, 1, "payments", "refund.create", "default", "r", "s", "{}", "d" * 64, deadline, "w")


def executed(outcome: Outcome = Outcome.OK, key: str = KEY) -> Executed:
    return Executed("x-1", key, T + 1, 1, outcome, None, T, T + 1, None, "w")


def receipt(key: str = KEY) -> Receipt:
    return Receipt("rc-1", key, T + 2, 1, "r-1", ReceiptSource.CALL, "{}")


# -- deadline index ---------------------------------------------------------------------------


def test_due_of_an_open_and_a_settled_effect() -> None:
    pending = fold([intent()])
    done = fold([intent(), executed(), receipt()])
    assert pending is not None and done is not None
    assert due_of(pending, {}, 60_000) == T + 10_000
    assert due_of(done, {}, 60_000) is None


def test_rebuild_keeps_only_assigned_partitions_and_due_keys() -> None:
    idx = DeadlineIndex()
    idx.rebuild([("a", 5), ("b", None), ("c", 7)], frozenset({0}), lambda k: 0 if k != "c" else 1)
    assert set(idx.entries) == {"a"} and idx.assigned == frozenset({0})
    idx.forget()
    assert idx.assigned is None


def test_a_deadline_fires_only_after_grace_and_once_folded_to_where_the_partition_stood() -> None:
    idx = DeadlineIndex(grace_ms=1000)
    idx.rebuild([], frozenset({0}), lambda k: 0)
    idx.set("k", 0, 10_000)
    folded = {0: 4}
    idx.record_highwaters(10_500, {0: 5})
    assert idx.due(10_999, folded.__getitem__) == []  # within grace
    idx.record_highwaters(11_000, {0: 9})  # the partition stood at 9 when the deadline passed
    assert idx.due(11_100, folded.__getitem__) == []  # folded only through offset 4
    folded[0] = 8
    assert [k for k, _ in idx.due(11_100, folded.__getitem__)] == ["k"]
    idx.mark_sent("k", 0, 10_000, 11_100)
    assert idx.due(11_100 + RESEND_AFTER_MS - 1, folded.__getitem__) == []
    assert [k for k, _ in idx.due(11_100 + RESEND_AFTER_MS, folded.__getitem__)] == ["k"]
    idx.set("k", 0, None)
    assert len(idx) == 0 and idx.oldest_due() is None


def test_due_finds_each_past_due_key_once_at_its_latest_due_time() -> None:
    idx = DeadlineIndex(grace_ms=0)
    idx.rebuild([("old", 50), ("later", 10_000)], frozenset({0}), lambda k: 0)

    def due(now: int) -> list[str]:
        idx.record_highwaters(now, {0: 0})  # nothing to fold: every past-due key may fire
        return sorted(k for k, _ in idx.due(now, lambda p: 0))

    for t in (100, 5_000, 100, 7_000, 100):  # moved back and forth: its heap holds each time
        idx.set("moved", 0, t)
    idx.set("moved-away", 0, 100)
    idx.set("moved-away", 0, 9_000)
    idx.set("closed", 0, 100)
    idx.set("closed", 0, None)
    assert due(1_000) == ["moved", "old"]
    assert due(1_000) == ["moved", "old"]  # not acted on: found again
    idx.mark_sent("old", 0, 50, 1_000)
    assert due(1_001) == ["moved"]  # sent: not again before RESEND_AFTER_MS
    assert due(9_500) == ["moved", "moved-away", "old"]  # sent RESEND_AFTER_MS ago: again
    assert due(10_000 + RESEND_AFTER_MS) == ["later", "moved", "moved-away", "old"]


def test_the_deadline_heap_stays_bounded_by_the_entries() -> None:
    idx = DeadlineIndex(grace_ms=0)
    idx.rebuild([], frozenset({0}), lambda k: 0)
    for i in range(20_000):
        idx.set(f"k{i % 100}", 0, 1_000_000 + i)  # 100 keys, each moved 200 times
    assert len(idx) == 100
    assert idx._heaped == sum(map(len, idx._heaps.values())) <= 2 * len(idx) + 1024 + 1
    idx.record_highwaters(10**9, {0: 0})
    assert len(idx.due(10**9, lambda p: 0)) == 100


def test_a_partition_behind_its_mark_holds_its_own_deadlines_only_and_costs_one_look() -> None:
    # A worker catching up: 50,000 deadlines past due in partition 0, which is folded only up to
    # offset 10 of the 100 it stood at; partition 1 is folded up to where it stood.
    idx = DeadlineIndex(grace_ms=1000)
    idx.rebuild([(f"a{i}", 1_000 + i) for i in range(50_000)] + [("b", 2_000)], frozenset({0, 1}),
                lambda k: 0 if k.startswith("a") else 1)  # fmt: skip
    for t in range(0, 60_000, 100):
        idx.record_highwaters(t, {0: 100, 1: 5})
    looks: list[int] = []

    def folded(p: int) -> int:
        looks.append(p)
        return 10 if p == 0 else 4

    assert idx.any_past_due(60_000)
    assert [k for k, _ in idx.due(60_000, folded)] == ["b"]
    assert sorted(looks) == [0, 1]  # asked once per partition, not once per entry
    assert idx._heaped == 50_001  # nothing of partition 0 was taken out and put back
    # Once partition 0 is folded up to its mark, all of its past deadlines fire, in due order.
    fired = [k for k, _ in idx.due(60_000, lambda p: 99)]
    assert len(fired) == 50_001 and set(fired) == {"b", *(f"a{i}" for i in range(50_000))}
    assert [k for k in fired if k != "b"][:3] == ["a0", "a1", "a2"]


def test_any_past_due_is_false_before_grace_and_when_empty() -> None:
    idx = DeadlineIndex(grace_ms=1000)
    idx.rebuild([], frozenset({0}), lambda k: 0)
    assert not idx.any_past_due(10**12)
    idx.set("k", 0, 5_000)
    assert not idx.any_past_due(5_999) and idx.any_past_due(6_000)
    idx.set("k", 0, None)
    idx.record_highwaters(6_000, {0: 0})
    assert idx.due(6_000, lambda p: 0) == []  # the stale heap item is dropped, not fired
    assert not idx.any_past_due(6_000)


# -- batch fold ---------------------------------------------------------------------------------


def _encode(effect: Effect) -> bytes:
    return effect.effect_id.encode() + bytes([len(effect.facts)])


def test_a_keys_events_fold_in_order_into_one_value() -> None:
    result = fold_key(None, [("m1", intent()), ("m2", executed()), ("m3", receipt())], _encode)
    assert result.after is not None and result.after.state is State.CONFIRMED
    # Three events and the claim verdict the first intent of attempt 1 earns, in the same write.
    assert result.value == KEY.encode() + b"\x04"
    assert [s[1].version for s in result.steps] == [2, 3, 4] and result.rejected == []
    assert [type(f).__name__ for f in result.after.facts].count("Claimed") == 1


def test_a_replayed_batch_changes_nothing_and_writes_nothing() -> None:
    before = fold([intent(), executed()])
    result = fold_key(before, [("m1", intent()), ("m2", executed())], _encode)
    assert result.after is before and result.value is None and result.steps == []


def test_an_uncertain_change_is_emitted() -> None:
    result = fold_key(None, [("m1", intent()), ("m2", executed(Outcome.UNKNOWN))], _encode)
    assert [type(u) for u in result.emitted] == [UncertainEffect]


def test_an_event_that_cannot_be_applied_is_rejected_and_the_rest_folds() -> None:
    other = intent(key="payments:other", eid="i-9")
    result = fold_key(fold([intent()]), [("bad", other), ("m2", executed())], _encode)
    assert [tag for tag, _ in result.rejected] == ["bad"]
    assert result.after is not None and result.after.state is State.EXECUTED


def test_the_event_that_would_make_the_value_too_large_is_rejected() -> None:
    def encode(effect: Effect) -> bytes:
        if len(effect.facts) > 3:  # the intent, its claim verdict and the outcome fit; a receipt does not
            raise TableValueTooLarge(effect.effect_id, 10**6)
        return b"v" * len(effect.facts)

    result = fold_key(None, [("m1", intent()), ("m2", executed()), ("m3", receipt())], encode)
    assert [tag for tag, _ in result.rejected] == ["m3"]
    assert result.value == b"vvv" and result.after is not None and result.after.version == 3


def test_group_by_key_keeps_arrival_order_per_key() -> None:
    a1, b1, a2 = intent(), intent(key="b", eid="j"), executed()
    groups = group_by_key([(KEY, 1, a1), ("b", 2, b1), (KEY, 3, a2)])
    assert groups == {KEY: [(1, a1), (3, a2)], "b": [(2, b1)]}


# -- lookup route -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.t += s


def route(folded: dict[int, tuple[int, int]], effect: Effect | None, *, ready: bool = True, owned: bool = True,
          token: str | None = None) -> LookupRoute:  # fmt: skip
    p = partition_for(KEY.encode(), 3)
    clock = Clock()

    async def highwaters(_p: int) -> tuple[int, int]:
        return 10, 0

    return LookupRoute(
        partitions=3, bound_s=1.0, token=token, own_url="http://me", ready=lambda: ready,
        assigned=lambda: frozenset({p}) if owned else frozenset(), highwaters=highwaters,
        folded=lambda q: folded[q], load=lambda k: effect if k == KEY else None,
        encode_event=default_codec().encode, clock=clock, sleep=clock.sleep,
    )  # fmt: skip


def test_lookup_answers_once_folded_to_the_high_watermark() -> None:
    p = partition_for(KEY.encode(), 3)
    effect = fold([intent(), executed()])
    status, body = asyncio.run(route({p: (9, -1)}, effect).get(KEY))
    assert status == 200 and body["effect_id"] == KEY and body["state"] == "EXECUTED"
    codec = default_codec()
    assert [codec.decode(base64.b64decode(e)) for e in body["events"]] == list(effect.facts)  # type: ignore[union-attr]


def test_lookup_says_lagging_after_its_bound() -> None:
    p = partition_for(KEY.encode(), 3)
    status, body = asyncio.run(route({p: (5, -1)}, None).get(KEY))
    assert status == 503 and body["lagging"] and body["processed"] == 5 and body["high_watermark"] == 10


def test_lookup_of_an_unknown_key_names_it() -> None:
    p = partition_for(KEY.encode(), 3)
    status, body = asyncio.run(route({p: (9, -1)}, None).get(KEY))
    assert status == 404 and body == {"effect_id": KEY, "known": False, "partition": p, "high_watermark": 10}


def test_a_high_watermark_the_broker_does_not_tell_in_time_is_a_503_within_the_bound() -> None:
    """The owner's question to the broker counts in the lookup's bound: a silent broker is an
    answer (503, lagging, owned) in about ``bound_s``, not a request the forwarding worker gives up
    on and reports as a partition nobody owns."""
    p = partition_for(KEY.encode(), 3)
    r = route({p: (9, -1)}, None)
    r.bound_s = 0.2

    async def silent(_p: int) -> tuple[int, int]:
        await asyncio.sleep(60)
        return 10, 0

    r.highwaters = silent

    async def ask() -> tuple[float, Any]:
        t = asyncio.get_running_loop().time()
        answer = await r.get(KEY)
        return asyncio.get_running_loop().time() - t, answer

    took, (status, body) = asyncio.run(ask())
    assert status == 503 and body["lagging"] and body["owned"] and "did not tell" in body["reason"], body
    assert took < 5, took


def test_a_forward_to_a_worker_that_does_not_answer_says_so() -> None:
    """A peer that times out may be the owner: the answer names it, rather than "no worker owns"."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections and never answers
    try:
        port = listener.getsockname()[1]
        p = partition_for(KEY.encode(), 3)
        r = route({p: (9, -1)}, None, owned=False)
        r.bound_s = 0.2
        r.peers = lambda: {f"http://127.0.0.1:{port}", "http://me"}
        status, body = asyncio.run(r.get(KEY))
    finally:
        listener.close()
    assert status == 503 and body["lagging"], body
    assert "did not answer" in body["reason"] and f"127.0.0.1:{port}" in body["reason"], body


def test_lookup_refusals_token_starting_and_not_owner() -> None:
    p = partition_for(KEY.encode(), 3)
    assert asyncio.run(route({p: (9, -1)}, None, token="s").get(KEY))[0] == 401
    assert asyncio.run(route({p: (9, -1)}, None, token="s").get(KEY, "Bearer s"))[0] == 404
    assert asyncio.run(route({p: (9, -1)}, None, ready=False).get(KEY))[0] == 503
    assert asyncio.run(route({p: (9, -1)}, None, owned=False).get(KEY, owner_only=True))[0] == 421
    assert authorized(None, "") and not authorized("s", "Bearer t")


def test_a_lookup_token_that_is_not_utf8_is_a_401() -> None:
    """aiohttp hands the header ``Bearer \\xff`` over as ``'Bearer \\udcff'``: a 401, not a 500."""
    p = partition_for(KEY.encode(), 3)
    assert asyncio.run(route({p: (9, -1)}, None, token="s").get(KEY, "Bearer \udcff"))[0] == 401
    assert not authorized("s", "Bearer s\udcff") and not authorized("s", "Bearer \ud800")


def test_the_folds_raw_schema_gives_what_fausts_raw_serializers_give(tmp_path: Path) -> None:
    """The fold's source topic reads records with ``processor.RawSchema``: the same key and value as
    faust's own schema with the raw serializers, for bytes, empty bytes, None and a memoryview."""
    from faust.types import Message

    from effect_ledger.processors.processor import RawSchema

    async def check() -> None:
        app = faust.App("raw-schema-test", broker="kafka://127.0.0.1:1", datadir=str(tmp_path), store="memory://")
        kinds: dict[str, Any] = {
            "key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw",
        }  # fmt: skip
        ours, faust_own = RawSchema(**kinds), faust.Schema(**kinds)
        for key, value in ((b"payments:k", b"\xc3\x01body"), (b"", b""), (None, None), (memoryview(b"k"), b"v")):
            msg = Message("t", 0, 1, 0.0, 0, headers=[], key=key, value=value, checksum=None)
            assert ours.loads_key(app, msg) == faust_own.loads_key(app, msg)
            assert type(ours.loads_key(app, msg)) is type(faust_own.loads_key(app, msg))
            assert ours.loads_value(app, msg) == faust_own.loads_value(app, msg)
            event = await ours.compile(app)(msg)
            assert (event.key, event.value) == (faust_own.loads_key(app, msg), faust_own.loads_value(app, msg))

    asyncio.run(check())


def test_the_batch_fold_takes_each_records_log_time() -> None:
    """``fold_key`` with ``log_ms_of``: the intent's deadline counts from when the log took it (its
    writer's clock two hours behind changes nothing), its claim verdict is taken with it, and a
    timeout the log took before that deadline is not admitted."""
    from effect_ledger.core.effect import claim_of, timeout_event_id
    from effect_ledger.core.model import Intent, Timeout, TimeoutPhase

    T0 = 1_760_000_000_000  # noqa: N806
    slow = 7_200_000
    i = Intent("i1", KEY, T0 - slow, 1, "payments", "refund.create", "default", "run", "step", "{}", "d" * 64,
               T0 - slow + 10_000, "w1")  # fmt: skip
    t = Timeout(timeout_event_id(KEY, 1, TimeoutPhase.CALL), KEY, T0 + 20_000, 1, TimeoutPhase.CALL, T0 + 10_000)
    logged = {"i1": T0, t.event_id: T0 + 9_999}
    result = fold_key(None, [(e.event_id, e) for e in (i, t)], lambda e: b"x", logged.get)
    after = result.after
    assert after is not None and after.state is State.PENDING and after.deadline_ms == T0 + 10_000
    verdict = claim_of(after, 1)
    assert verdict is not None and after.log_time(verdict) == T0
    assert not after.has(t.event_id)  # taken before the deadline on the log's time: not a fact
    on_time = fold_key(after, [(t.event_id, t)], lambda e: b"x", {t.event_id: T0 + 10_000}.get).after
    assert on_time is not None and on_time.state is State.UNCERTAIN
