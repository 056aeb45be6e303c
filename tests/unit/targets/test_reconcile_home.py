"""One home for reconciliation (``effect_ledger.core.reconcile``): the target rule, asking under
the target's timeout, the next check by the target's backoff and the view reconcilers are given,
the same for the SDK, the embedded runner, the reconciliation consumers and the processor.

The target's backoff in both modes: here the embedded runner (a fake clock) and the processor's
due time (``processors.processor.due_of``, a pure function of the folded effect); end to end through
Kafka in ``tests/faults/test_target_backoff_kafka.py``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from effect_ledger.core.effect import Effect, fold, uncertain_event
from effect_ledger.core.model import Executed, Intent, Outcome, Resolution, State, Verdict
from effect_ledger.core.reconcile import (
    Backoff,
    EffectView,
    Target,
    Unknown,
    next_check_ms,
    target_for,
    target_name,
    view,
    view_of_uncertain,
)
from effect_ledger.errors import EffectUncertain
from effect_ledger.processors.deadline_index import due_of
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from effect_ledger.targets.ask import DEFAULT_ASK_TIMEOUT_S, CallableReconciler, ask, ask_timeout_s
from effect_ledger.targets.load import parse_targets
from tests.sdk_contract import T0, FakeClock, reconciler_of, run

SLOW = Backoff(first_s=3600.0, factor=1.0, max_s=3600.0, max_tries=3)
QUICK = Backoff(first_s=0.05, factor=1.0, max_s=1.0, max_tries=3)
DEADLINE = T0 + 10_000


def uncertain_effect(*resolutions: Resolution, target: str = "slow") -> Effect:
    key = f"{target}:" + "ab" * 32
    i = Intent("i1", key, T0, 1, target, "charge", "default", "run-1", "s", '{"n":1}', "d" * 64, DEADLINE, "w")
    ex = Executed("x1", key, T0 + 10, 1, Outcome.UNKNOWN, "reset", T0, T0 + 10, None, "w")
    e = fold([i, ex, *resolutions])
    assert e is not None and e.state is State.UNCERTAIN
    return e


def unknown(tries: int, at: int, target: str = "slow") -> Resolution:
    key = f"{target}:" + "ab" * 32
    return Resolution(f"resolution:1:{tries}:{key}", key, at, 1, Verdict.UNKNOWN, "http", "503", None, None, tries)


# --- the next check: the target's backoff ---------------------------------------------------------------


def test_next_check_is_the_last_answer_plus_the_targets_backoff() -> None:
    e = uncertain_effect(unknown(1, DEADLINE + 5))
    assert next_check_ms(e, Target("slow", backoff=SLOW), DEADLINE + 5) == DEADLINE + 5 + 3_600_000
    assert next_check_ms(e, Target("slow", backoff=QUICK), DEADLINE + 5) == DEADLINE + 5 + 50
    assert next_check_ms(uncertain_effect(), Target("slow", backoff=SLOW), DEADLINE) is None  # never asked: now


def test_the_processor_spaces_checks_by_each_targets_backoff() -> None:
    """Kafka mode: the time the processor re-publishes an uncertain effect to the reconcilers."""
    targets = {"slow": Target("slow", backoff=SLOW), "quick": Target("quick", backoff=QUICK)}
    slow = uncertain_effect(unknown(1, DEADLINE + 5))
    quick = uncertain_effect(unknown(1, DEADLINE + 5, "quick"), target="quick")
    assert due_of(slow, targets, 60_000) == DEADLINE + 5 + 3_600_000
    assert due_of(quick, targets, 60_000) == DEADLINE + 5 + 50
    # A target the processor was not told about: the default backoff (one rule, see target_for).
    assert due_of(slow, {}, 60_000) == DEADLINE + 5 + Backoff().delay_ms(1)
    # Nobody answered yet: looked at again first_check_ms after it became uncertain.
    assert due_of(uncertain_effect(), targets, 60_000) == uncertain_effect().updated_ms + 60_000


def test_the_embedded_runner_spaces_checks_by_each_targets_backoff(tmp_path: Path) -> None:
    """Embedded mode, the same declaration as the Kafka fault test: the slow target is not asked
    again after the default backoff's 1 s (nor 2 s), the quick one is."""
    parsed = parse_targets(
        """
[targets.slow]
lookup = "none"
backoff = { first = "1h", factor = 1, tries = 3 }

[targets.quick]
lookup = "none"
backoff = { first = "50ms", factor = 1, tries = 3 }
""",
        "targets.toml",
    )
    # Asked by a reconciler that never knows (in place of the lookup the Kafka test serves).
    declared = [replace(t, reconciler=CallableReconciler(unknown_answer)) for t in parsed]
    clock = FakeClock()
    ASKED.clear()

    async def main() -> None:
        ledger = await Ledger.open(str(tmp_path / "effects.db"), clock=clock, targets=declared)
        try:
            keys = {}
            for name in ("slow", "quick"):

                def reset(_key: str) -> None:
                    raise ConnectionError("connection reset")

                with pytest.raises(EffectUncertain) as raised:
                    await ledger.execute(
                        target=name, operation="charge", run_id="run-1", step=name, request={"n": 1}, call=reset,
                    )  # fmt: skip
                keys[name] = raised.value.effect_id
            runner = Runner(ledger, grace_ms=1000)
            await runner.tick()
            assert sorted(ASKED) == ["quick", "slow"]
            for _ in range(2):
                clock.advance(2_000)  # past the default backoff (1 s, then 2 s)
                await runner.tick()
            assert ASKED.count("slow") == 1
            assert ASKED.count("quick") == 3
            states = {name: getattr(await ledger.get(key), "state", None) for name, key in keys.items()}
            assert states == {"slow": State.UNCERTAIN, "quick": State.ESCALATED}
            clock.advance(3_600_000)
            await runner.tick()
            assert ASKED.count("slow") == 2
        finally:
            await ledger.close()

    run(main())


ASKED: list[str] = []  # the target of every ask, in order


def unknown_answer(v: EffectView) -> Unknown:
    """A reconciler whose destination never knows."""
    ASKED.append(v.target)
    return Unknown("503")


# --- which target, and asking it --------------------------------------------------------------------------


def test_an_undeclared_target_is_a_default_target_and_nobody_is_asked() -> None:
    declared = Target("slow", backoff=SLOW)
    assert target_for({"slow": declared}, "slow") == (declared, True)
    fallback, known = target_for({"slow": declared}, "mail")
    assert (fallback, known) == (Target("mail"), False)
    answer, name = asyncio.run(ask(view(uncertain_effect()), fallback, DEADLINE, declared=False))
    assert name == "undeclared" and isinstance(answer, Unknown) and "not declared" in answer.reason
    assert target_name(uncertain_effect()) == "slow"


def test_a_reconciler_is_bounded_by_the_targets_timeout() -> None:
    async def hangs(_v: EffectView) -> Unknown:
        await asyncio.Event().wait()  # never answers
        raise AssertionError

    target = Target("slow", reconciler=CallableReconciler(hangs, "hangs"), timeout_s=0.05)
    answer, name = asyncio.run(ask(view(uncertain_effect()), target, DEADLINE))
    assert name == "hangs" and isinstance(answer, Unknown) and "TimeoutError" in answer.reason


def test_the_ask_timeout_is_the_targets_else_its_lookups_else_the_default() -> None:
    from effect_ledger.targets.http import HttpReconciler

    lookup = HttpReconciler("http://127.0.0.1:9/by-key/{key}", timeout=3.0)
    assert ask_timeout_s(Target("t", reconciler=lookup)) == 3.0
    assert ask_timeout_s(Target("t", reconciler=lookup, timeout_s=7.0)) == 7.0
    assert ask_timeout_s(Target("t", reconciler=reconciler_of(None))) == DEFAULT_ASK_TIMEOUT_S


# --- the view: tries and executed derived once -------------------------------------------------------------


def test_the_sdk_view_is_the_view_of_the_work_item() -> None:
    e = uncertain_effect(unknown(1, DEADLINE + 5), unknown(2, DEADLINE + 900))
    assert view(e) == view_of_uncertain(uncertain_event(e))
    assert (view(e).tries, view(e).executed) == (2, False)


def test_a_lookups_declared_timeout_bounds_its_ask() -> None:
    declared = {
        t.name: t
        for t in parse_targets(
            """
[targets.payments]
lookup = "http://127.0.0.1:9/by-key/{key}"
timeout = "4s"

[targets.sms]
lookup = "none"
"""
        )
    }
    assert ask_timeout_s(declared["payments"]) == 4.0
    assert ask_timeout_s(declared["sms"]) == DEFAULT_ASK_TIMEOUT_S
