"""``SyncLedger.open(..., inline_calls=True)``: the call runs in the caller's thread, with no
hand-off to a call thread and back, and without the cut-off at its deadline (``effect_ledger.sdk.sync``).
The whole SDK contract runs through it too (``test_sdk_sync.TestSyncLedgerInlineCalls``), and the
crash matrix (``tests/crash/test_crash_matrix.py``, ``ledger-sync-inline``)."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import SyncLedger
from effect_ledger.core.model import Executed, Outcome, State
from effect_ledger.errors import InvalidEffect
from tests.sdk_contract import DECLARED, OPERATION, REQUEST, TARGET

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def open_inline(tmp_path: Path) -> SyncLedger:
    return SyncLedger.open(str(tmp_path / "effects.db"), targets=DECLARED, inline_calls=True)


def execute(ledger: SyncLedger, call: Any, step: str = "s") -> Any:
    return ledger.execute(
        target=TARGET, operation=OPERATION, run_id="run-1", step=step, request=REQUEST, call=call, timeout=30
    )


def test_the_call_runs_in_the_callers_thread_with_its_context(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []

    def call(key: str) -> dict[str, str]:
        seen.append((threading.get_ident(), request_id.get()))
        return {"id": "re_1"}

    with open_inline(tmp_path) as ledger:
        assert ledger.inline_calls
        request_id.set("req-42")
        c = execute(ledger, call)
        assert c.called and c.receipt_id == "re_1"
        out: dict[str, Any] = {}

        def other() -> None:
            request_id.set("req-43")
            out["c"] = execute(ledger, call, step="other")
            out["me"] = threading.get_ident()

        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert seen == [(threading.get_ident(), "req-42"), (out["me"], "req-43")]
        assert not [t for t in threading.enumerate() if t.name.startswith("effect-ledger call")]


def test_an_inline_call_may_run_an_event_loop_of_its_own(tmp_path: Path) -> None:
    """The caller's loop is waiting under the call: a client that runs ``asyncio.run`` (or a call
    that returns a coroutine) must not find it running."""

    async def answer(n: int) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"id": f"re_{n}"}

    with open_inline(tmp_path) as ledger:
        assert execute(ledger, lambda key: asyncio.run(answer(1))).receipt_id == "re_1"
        assert execute(ledger, lambda key: answer(2), step="s2").receipt_id == "re_2"
        # and the caller's own loop is back for the next operation
        assert ledger.get(execute(ledger, lambda key: {"id": "re_3"}, step="s3").effect_id).state is State.CONFIRMED  # type: ignore[union-attr]


def test_an_inline_call_that_runs_a_coroutine_leaves_the_threads_current_loop_alone(tmp_path: Path) -> None:
    """A call that returns a coroutine is run on a loop of its own, which is never made the
    thread's current loop: an application's ``asyncio.set_event_loop`` stands after the call."""

    async def answer() -> dict[str, str]:
        return {"id": "re_1"}

    app_loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(app_loop)
        with open_inline(tmp_path) as ledger:
            assert execute(ledger, lambda key: answer()).receipt_id == "re_1"
        assert asyncio.get_event_loop() is app_loop
    finally:
        asyncio.set_event_loop(None)
        app_loop.close()


def test_an_operation_from_inside_an_inline_call_goes_to_the_ledgers_loop(tmp_path: Path) -> None:
    """The caller's loop is busy with the call: an operation the call makes on the same ledger
    (a read, another effect) is answered by the ledger's own loop, not a deadlock."""
    with open_inline(tmp_path) as ledger:
        inner: dict[str, Any] = {}

        def call(key: str) -> dict[str, str]:
            inner["state"] = ledger.get(key).state  # type: ignore[union-attr]
            inner["c"] = execute(ledger, lambda k: {"id": "re_inner"}, step="inner")
            return {"id": "re_outer"}

        assert execute(ledger, call).receipt_id == "re_outer"
        assert inner["state"] is State.PENDING and inner["c"].receipt_id == "re_inner"


def test_from_a_thread_that_runs_a_loop_the_call_still_goes_to_a_call_thread(tmp_path: Path) -> None:
    """There the operation runs on the ledger's loop, which a call must not block."""
    seen: list[str] = []

    def call(key: str) -> dict[str, str]:
        seen.append(threading.current_thread().name)
        return {"id": "re_1"}

    async def inside_a_coroutine() -> Any:
        return execute(ledger, call)

    with open_inline(tmp_path) as ledger:
        assert asyncio.run(inside_a_coroutine()).called
    assert len(seen) == 1 and seen[0].startswith("effect-ledger call"), seen


def test_an_inline_call_that_exits_is_recorded_unknown_and_the_ledger_keeps_working(tmp_path: Path) -> None:
    def exits(key: str) -> None:
        sys.exit(3)

    with open_inline(tmp_path) as ledger:
        with pytest.raises(SystemExit) as ei:
            execute(ledger, exits)
        assert ei.value.code == 3
        effect = ledger.get(_key())
        assert effect is not None and effect.state is State.UNCERTAIN
        assert [(f.outcome, f.error) for f in effect.facts if isinstance(f, Executed)] == [
            (Outcome.UNKNOWN, "CallExited: SystemExit(3)")
        ]
        assert execute(ledger, lambda key: {"id": "re_2"}, step="another").receipt_id == "re_2"


def _key() -> str:
    from effect_ledger.core.keys import effect_key

    return effect_key(TARGET, OPERATION, "run-1", "s")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_inline_calls_must_be_true_or_false_and_nothing_is_created(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "effects.db"
    with pytest.raises(InvalidEffect, match="inline_calls must be True or False"):
        SyncLedger.open(str(path), targets=DECLARED, inline_calls=value)
    assert list(tmp_path.iterdir()) == []
