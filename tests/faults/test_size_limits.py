"""Every size is bounded, and checked before anything is written (issue 10, item 5, the SDK side).

Before the fix the SDK accepted a 2 MB request, wrote it to the outbox and called the destination;
Kafka then refused the event for ever. Now a request or an id over its documented limit is refused
with ``EffectTooLarge`` before anything is written or called; what comes back from the destination
(a receipt value, an error text) is never refused, since the call already happened: it is stored
bounded (digested and flagged, or truncated) so no event can exceed what Kafka accepts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import errors
from effect_ledger.core.model import Flag, State
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import EffectUncertain, InvalidEffect, LedgerError
from effect_ledger.sdk.ledger import Ledger
from tests.faults._common import event_bodies, execute
from tests.sdk_contract import KEY, TARGET, Destination, FakeClock, db_counts, run

MB2 = 2 * 1024 * 1024


class _Limits:
    """``effect_ledger.core.limits``, imported when first used: on code without the module, each
    test fails at its own defect, not the whole file at collection."""

    def __getattr__(self, name: str) -> Any:
        from effect_ledger.core import limits as module

        return getattr(module, name)


limits = _Limits()


async def open_ledger(path: str) -> Ledger:
    return await Ledger.open(path, targets=[Target(TARGET)], clock=FakeClock())


@pytest.mark.parametrize(
    "given",
    [
        {"request": {"order": "123", "note": "x" * MB2}},
        {"run_id": "r" * MB2},
        {"step": "s" * MB2},
        {"namespace": "n" * MB2},
        {"key": "k-1", "run_id": "r" * MB2},
    ],
    ids=["request", "run_id", "step", "namespace", "run_id-with-key"],
)
def test_2mb_input_is_refused_before_anything_is_written_or_called(tmp_path: Path, given: dict[str, Any]) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            with pytest.raises(InvalidEffect) as ei:
                await execute(ledger, dest, **given)
            assert isinstance(ei.value, errors.EffectTooLarge), repr(ei.value)
            assert "limit" in str(ei.value)
        finally:
            await ledger.close()

    run(body())
    assert db_counts(path) == (0, 0) and dest.calls == []


def test_request_at_the_limit_is_accepted(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()
    overhead = len(json.dumps({"note": ""}, separators=(",", ":")))
    request = {"note": "x" * (limits.MAX_REQUEST_BYTES - overhead)}

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            assert (await execute(ledger, dest, request=request)).called
            with pytest.raises(errors.EffectTooLarge):
                await execute(ledger, dest, step="one-more", request={"note": request["note"] + "x"})
        finally:
            await ledger.close()

    run(body())
    assert dest.calls == [KEY]
    assert max(size for _, _, size in event_bodies(path)) < limits.MAX_EVENT_BYTES


def test_oversized_call_result_is_stored_digested_and_flagged(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    calls: list[str] = []

    async def call(key: str) -> dict[str, Any]:
        calls.append(key)
        return {"id": "re_big", "statement": "x" * MB2}

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            with pytest.raises(LedgerError) as ei:
                await execute(ledger, call)
            assert isinstance(ei.value, errors.ReceiptNotRecordable), repr(ei.value)
            c = ei.value.confirmation
            assert c.called and c.receipt_id == "re_big" and len(c.value["statement"]) == MB2
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.CONFIRMED and Flag.INEXACT_RECEIPT in effect.flags
            assert effect.receipt is not None and len(effect.receipt.value.encode()) <= limits.MAX_RECEIPT_BYTES
            stored = json.loads(effect.receipt.value)["effect_ledger.inexact"]
            assert stored["bytes"] > MB2 and len(stored["sha256"]) == 64
            again = await execute(ledger, call)
            assert not again.called and again.receipt_id == "re_big" and calls == [KEY]
        finally:
            await ledger.close()

    run(body())
    assert max(size for _, _, size in event_bodies(path)) < limits.MAX_EVENT_BYTES


def test_huge_error_text_is_truncated_not_written_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()
    dest.fail.append(ConnectionError("reset by peer " + "x" * MB2))

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            with pytest.raises(EffectUncertain):
                await execute(ledger, dest)
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.UNCERTAIN
            assert effect.reason is not None and "reset by peer" in effect.reason
            assert len(effect.reason.encode()) <= limits.MAX_TEXT_BYTES + 64
        finally:
            await ledger.close()

    run(body())
    assert max(size for _, _, size in event_bodies(path)) <= 2 * limits.MAX_TEXT_BYTES


def test_oversized_webhook_receipt_value_is_stored_digested_not_lost(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()
    dest.fail.append(ConnectionError("reset"))

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            with pytest.raises(EffectUncertain):
                await execute(ledger, dest)
            effect = await ledger.record_receipt(KEY, "re_hook", {"id": "re_hook", "pdf": "p" * MB2}, attempt=1)
            assert effect.state is State.CONFIRMED and Flag.INEXACT_RECEIPT in effect.flags
            assert effect.receipt is not None and effect.receipt.receipt_id == "re_hook"
        finally:
            await ledger.close()

    run(body())
    assert max(size for _, _, size in event_bodies(path)) < limits.MAX_EVENT_BYTES


@pytest.mark.parametrize(
    "given",
    [
        {"reason": "r" * MB2},
        {"by": "b" * MB2},
        {"receipt_id": "i" * MB2, "decision": "CONFIRMED"},
    ],
    ids=["reason", "by", "receipt_id"],
)
def test_oversized_decision_is_refused_and_nothing_written(tmp_path: Path, given: dict[str, Any]) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()
    dest.fail.append(ConnectionError("reset"))

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            with pytest.raises(EffectUncertain):
                await execute(ledger, dest)
            before = db_counts(path)
            args: dict[str, Any] = {"decision": "ABANDONED", "by": "oncall", "reason": "checked", **given}
            with pytest.raises(errors.EffectTooLarge):
                await ledger.decide(KEY, args.pop("decision"), **args)
            with pytest.raises(errors.EffectTooLarge):
                await ledger.record_receipt(KEY, "i" * MB2)
            assert db_counts(path) == before
        finally:
            await ledger.close()

    run(body())
