"""``SyncLedger``'s call threads are kept between calls: a call runs in a thread that ran an earlier
call, a call that hangs past its deadline holds only its own thread (the next call gets another),
and closing the ledger ends the idle ones."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import SyncLedger
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk.sync import _CallThreads
from tests.sdk_contract import wait_until


def idle_call_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == _CallThreads.IDLE_NAME and t.is_alive()]


def execute(ledger: SyncLedger, step: str, call: Callable[[str], Any], timeout: float = 10.0) -> Any:
    return ledger.execute(
        target="payments", operation="refund.create", run_id="r", step=step, request={"order": step},
        call=call, timeout=timeout,
    )  # fmt: skip


def test_sequential_calls_run_in_one_kept_thread_named_after_the_call(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []

    def call(key: str) -> dict[str, str]:
        seen.append((threading.get_ident(), threading.current_thread().name))
        return {"id": "re_" + key[-8:]}

    with SyncLedger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
        for i in range(5):
            execute(ledger, f"s{i}", call)
        assert len({ident for ident, _ in seen}) == 1, seen
        assert all(name.startswith("effect-ledger call payments:") for _, name in seen), seen
        wait_until(lambda: len(idle_call_threads()) == 1, what="the call thread to be idle")
    wait_until(lambda: not idle_call_threads(), what="close to end the idle call thread")


def test_a_call_that_hangs_past_its_deadline_keeps_its_thread_and_the_next_call_gets_another(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    threads: list[int] = []

    def hangs(key: str) -> None:
        threads.append(threading.get_ident())
        release.wait(60)

    def quick(key: str) -> dict[str, str]:
        threads.append(threading.get_ident())
        return {"id": "re_quick"}

    with SyncLedger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
        with pytest.raises(EffectUncertain):
            execute(ledger, "hangs", hangs, timeout=0.2)
        assert execute(ledger, "quick", quick).receipt_id == "re_quick"
        assert threads[0] != threads[1], "the hung call's thread was given another call"
        release.set()
        # The late return is dropped, and its thread goes back to the idle ones.
        wait_until(lambda: len(idle_call_threads()) == 2, what="both call threads to be idle")
        assert execute(ledger, "again", quick).receipt_id == "re_quick"
        assert threads[2] in threads[:2]


def test_idle_threads_are_bounded_and_end_after_their_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_CallThreads, "MAX_IDLE", 2)
    monkeypatch.setattr(_CallThreads, "IDLE_S", 0.2)
    pool = _CallThreads()
    go = threading.Event()
    started = threading.Semaphore(0)

    def job() -> None:
        started.release()
        go.wait(10)

    for i in range(4):
        pool.run(job, f"effect-ledger call bounded-{i}")
    for _ in range(4):
        assert started.acquire(timeout=10)
    go.set()
    # Four threads ran at once; two stay idle at most, and those end after IDLE_S.
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("effect-ledger call bounded")],
               what="the calls to end")  # fmt: skip
    assert len(idle_call_threads()) <= 2
    wait_until(lambda: not idle_call_threads(), what="the idle threads to end")
    pool.close()


linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")


@linux_only
def test_the_hand_off_stays_on_the_callers_cpu_and_nothing_stays_pinned(tmp_path: Path) -> None:
    """While its call runs, the caller waits pinned to the CPU it was on (``_OneCore``), and the
    call's thread, woken there, runs the call with the caller's own mask (a thread the call
    starts inherits that, not one CPU); afterwards the caller's mask is what it was, also when its
    call was cut off at the deadline."""
    caller = threading.get_native_id()
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("one CPU allowed: there is no other core to stay off")
    seen: list[tuple[set[int], set[int], set[int]]] = []
    release = threading.Event()

    def observe() -> None:
        inherited: list[set[int]] = []
        child = threading.Thread(target=lambda: inherited.append(os.sched_getaffinity(0)))
        child.start()
        child.join(10)
        seen.append((os.sched_getaffinity(caller), os.sched_getaffinity(0), inherited[0]))

    def call(key: str) -> dict[str, str]:
        observe()
        return {"id": "re_1"}

    def hangs(key: str) -> None:
        observe()
        release.wait(60)

    with SyncLedger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
        try:
            for i in range(3):
                execute(ledger, f"s{i}", call)
                assert os.sched_getaffinity(0) == mine
            with pytest.raises(EffectUncertain):
                execute(ledger, "hangs", hangs, timeout=0.3)
            assert os.sched_getaffinity(0) == mine
        finally:
            release.set()
    assert len(seen) == 4
    for waiting_caller, call_thread, started_by_the_call in seen:
        assert len(waiting_caller) == 1 and waiting_caller <= mine, seen
        assert call_thread == mine and started_by_the_call == mine, seen


@linux_only
def test_an_interruption_right_after_the_pin_still_gives_the_caller_its_mask_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handler that raises (a second Ctrl-C, a SIGTERM turned into SystemExit) as the
    system call that pins the caller returns: the caller's mask comes back all the same."""
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("one CPU allowed: the caller is never pinned")
    real = os.sched_setaffinity
    raised: list[bool] = []

    def then_interrupted(pid: int, mask: Any) -> None:
        real(pid, mask)
        if pid == 0 and len(mask) == 1 and not raised:
            raised.append(True)
            raise KeyboardInterrupt

    with SyncLedger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
        execute(ledger, "warm", lambda key: {"id": "re_0"})  # a call thread to hand off to
        monkeypatch.setattr(os, "sched_setaffinity", then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            execute(ledger, "s", lambda key: {"id": "re_1"})
        monkeypatch.undo()
        assert raised and os.sched_getaffinity(0) == mine
        assert execute(ledger, "after", lambda key: {"id": "re_2"}).called


@linux_only
def test_a_caller_the_application_pinned_keeps_its_own_mask(tmp_path: Path) -> None:
    """A mask the application set (a set of CPUs, or one) is the one it has after each call."""
    original = os.sched_getaffinity(0)
    results: list[set[int]] = []

    def caller(mask: set[int]) -> None:
        os.sched_setaffinity(0, mask)
        execute(ledger, f"s{min(mask)}-{len(mask)}", lambda key: {"id": "re_1"})
        results.append(os.sched_getaffinity(0))

    with SyncLedger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
        masks = [original, {min(original)}]
        for mask in masks:
            t = threading.Thread(target=caller, args=(mask,))
            t.start()
            t.join(30)
    assert results == masks


@linux_only
def test_a_cpu_mask_that_cannot_be_set_leaves_the_hand_off_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(pid: int, mask: Any) -> None:
        raise PermissionError("not allowed here")

    monkeypatch.setattr(os, "sched_setaffinity", refused)
    mine = os.sched_getaffinity(0)
    with SyncLedger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
        for i in range(2):
            assert execute(ledger, f"s{i}", lambda key: {"id": "re_1"}).called
    assert os.sched_getaffinity(0) == mine
