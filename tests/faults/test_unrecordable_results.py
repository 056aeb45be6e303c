"""A call that returned OK is recorded whatever it returned (issue 10, item 4).

Before the fix, a value that is not JSON (a dict with mixed key types, a circular structure) or a
target whose ``receipt_id`` function raises gave the caller a raw TypeError/ValueError/KeyError
after the destination had acted: the effect stayed PENDING, the receipt was gone, and the retry
escalated. Now the outcome and a faithful, flagged representation of the value are recorded
(CONFIRMED), the caller gets ``ReceiptNotRecordable`` carrying the confirmation, and a later
execute returns the record without calling again.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import errors
from effect_ledger.core.model import Flag, ReceiptSource, State
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import LedgerError
from effect_ledger.sdk.ledger import Ledger
from tests.faults._common import execute
from tests.sdk_contract import KEY, TARGET, FakeClock, event_kinds, run


def mixed_keys() -> Any:
    return {1: "a", "b": 2}


def circular() -> Any:
    d: dict[str, Any] = {"id": "re_circ", "amount": 4800}
    d["self"] = d
    return d


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque refund re_77>"


def an_object() -> Any:
    return {"id": "re_obj", "who": Opaque()}


def a_datetime() -> Any:
    return {"id": "re_dt", "at": datetime.datetime(2024, 1, 2, 3, 4, 5)}


class Hostile:
    """Every way of looking at it raises: repr, str, and what JSON encoding would call."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __str__(self) -> str:
        raise RuntimeError("no str")


class HostileDict(dict):  # type: ignore[type-arg]
    """A mapping whose items, repr and str raise (JSON encoding walks items())."""

    def items(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("no items")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


def repr_raises() -> Any:
    return Hostile()


def inside_raises() -> Any:
    return {"id": "re_hostile", "who": Hostile()}


def iteration_raises() -> Any:
    return HostileDict(id="re_hd")


class Returning:
    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make
        self.calls: list[str] = []
        self.returned: list[Any] = []

    async def __call__(self, key: str) -> Any:
        self.calls.append(key)
        value = self.make()
        self.returned.append(value)
        return value


@pytest.mark.parametrize(
    ("make", "receipt_id", "shown", "approximation"),
    [
        (mixed_keys, None, "{1: 'a', 'b': 2}", {"1": "a", "b": 2}),
        (circular, "re_circ", "'self': {...}", None),
        (an_object, "re_obj", "<Opaque refund re_77>", {"id": "re_obj", "who": "<Opaque refund re_77>"}),
        (a_datetime, "re_dt", "datetime.datetime(2024, 1, 2, 3, 4, 5)", {"id": "re_dt", "at": "2024-01-02 03:04:05"}),
    ],
    ids=["mixed-key-dict", "circular", "object", "datetime"],
)
def test_unrecordable_call_result_is_confirmed_flagged_and_never_called_again(
    tmp_path: Path, make: Callable[[], Any], receipt_id: str | None, shown: str, approximation: Any
) -> None:
    path = str(tmp_path / "effects.db")
    dest = Returning(make)

    async def body() -> None:
        ledger = await Ledger.open(path, targets=[Target(TARGET)], clock=FakeClock())
        try:
            with pytest.raises(LedgerError) as ei:
                await execute(ledger, dest)
            err = ei.value
            assert isinstance(err, errors.ReceiptNotRecordable), repr(err)
            c = err.confirmation
            assert c.called and c.effect_id == KEY and c.source is ReceiptSource.CALL
            assert c.value is dest.returned[0] and not c.exact  # the caller still gets what it returned
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.CONFIRMED
            assert Flag.INEXACT_RECEIPT in effect.flags
            assert event_kinds(path, KEY) == ["Intent", "Executed", "Receipt"]
            assert effect.receipt is not None and effect.receipt.receipt_id == c.receipt_id
            if receipt_id is not None:
                assert c.receipt_id == receipt_id
            else:
                assert c.receipt_id.startswith("sha256:")
            stored = json.loads(effect.receipt.value)["effect_ledger.inexact"]
            assert shown in stored["repr"] and stored["type"] == "dict" and stored["reason"]
            assert stored.get("value") == approximation  # str() for what JSON cannot hold, when it can be had

            again = await execute(ledger, dest)
            assert not again.called and not again.exact and again.receipt_id == c.receipt_id
            assert again.value == json.loads(effect.receipt.value)
            assert dest.calls == [KEY]
        finally:
            await ledger.close()

    run(body())


@pytest.mark.parametrize("make", [repr_raises, inside_raises, iteration_raises], ids=["repr", "inside", "items"])
def test_a_result_whose_repr_or_str_raises_is_recorded_not_left_pending(
    tmp_path: Path, make: Callable[[], Any]
) -> None:
    """A successful call returning something whose repr, str or items() raise: the outcome is
    recorded (CONFIRMED, flagged inexact) and the caller gets ReceiptNotRecordable, never a bare
    RuntimeError with the call left PENDING (the next execute would then reconcile, not return)."""
    path = str(tmp_path / "effects.db")
    dest = Returning(make)

    async def body() -> None:
        ledger = await Ledger.open(path, targets=[Target(TARGET)], clock=FakeClock())
        try:
            with pytest.raises(LedgerError) as ei:
                await execute(ledger, dest)
            assert isinstance(ei.value, errors.ReceiptNotRecordable), repr(ei.value)
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.CONFIRMED
            assert Flag.INEXACT_RECEIPT in effect.flags
            assert event_kinds(path, KEY) == ["Intent", "Executed", "Receipt"]
            stored = json.loads(effect.receipt.value)["effect_ledger.inexact"]  # type: ignore[union-attr]
            assert stored["type"] in ("Hostile", "dict", "HostileDict") and stored["reason"]
            again = await execute(ledger, dest)
            assert not again.called and dest.calls == [KEY]
        finally:
            await ledger.close()

    run(body())


def test_receipt_id_function_that_raises_falls_back_to_the_digest_and_is_confirmed(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    dest = Returning(lambda: {"refund": "re_5", "status": "succeeded"})
    target = Target(TARGET, receipt_id=lambda value: value["id"])  # KeyError: the gateway answers "refund"

    async def body() -> None:
        ledger = await Ledger.open(path, targets=[target], clock=FakeClock())
        try:
            with pytest.raises(LedgerError) as ei:
                await execute(ledger, dest)
            err = ei.value
            assert isinstance(err, errors.ReceiptNotRecordable), repr(err)
            assert "KeyError" in str(err)
            c = err.confirmation
            assert c.called and c.receipt_id.startswith("sha256:")
            assert c.value == {"refund": "re_5", "status": "succeeded"} and c.exact  # the value itself is exact
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.CONFIRMED
            assert effect.receipt is not None and effect.receipt.receipt_id == c.receipt_id
            again = await execute(ledger, dest)
            assert not again.called and again.receipt_id == c.receipt_id and again.value == c.value
            assert dest.calls == [KEY]
        finally:
            await ledger.close()

    run(body())


def test_replayed_call_with_an_unrecordable_value_is_recorded_not_crashed(tmp_path: Path) -> None:
    """A destination that honours keys is asked by replaying the call; its answer is recorded the
    same way (the reconciler's Found goes through the same representation)."""
    from tests.sdk_contract import dead_owner, write_pending

    path = str(tmp_path / "effects.db")
    dest = Returning(circular)
    clock = FakeClock()

    async def body() -> None:
        ledger = await Ledger.open(path, targets=[Target(TARGET, honours_keys=True)], clock=clock)
        try:
            await write_pending(ledger, owner=dead_owner(), timeout_s=10)
            clock.advance(10_001)
            c = await execute(ledger, dest)
            assert not c.called and c.receipt_id == "re_circ" and not c.exact
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.CONFIRMED
            assert Flag.INEXACT_RECEIPT in effect.flags
            assert dest.calls == [KEY]
        finally:
            await ledger.close()

    run(body())
