"""Asking a destination, by idempotency key, whether an effect happened: the one place a
reconciler is called (``ask``), with its timeout, and a reconciler made of a plain function
(``CallableReconciler``). What an answer means is decided purely in ``effect_ledger.core.reconcile``
(``judge``); this module only asks.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from effect_ledger.core.reconcile import Absent, Answer, EffectView, Found, Target, Unknown, retention_passed


class CallableReconciler:
    """A reconciler from a plain (sync or async) function ``fn(effect: EffectView) -> Answer``."""

    def __init__(self, fn: Callable[[EffectView], Answer | Awaitable[Answer]], name: str | None = None) -> None:
        self._fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "callable"))

    async def check(self, effect: EffectView) -> Answer:
        """Call the function (awaiting it if it returns an awaitable); anything it returns other than
        Found, Absent or Unknown becomes Unknown. Its exceptions propagate to the caller."""
        result = self._fn(effect)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Found | Absent | Unknown):
            return Unknown(f"reconciler {self.name} returned {result!r}, not Found/Absent/Unknown")
        return result


#: How long one ask of a destination may take when neither the target nor its reconciler says.
DEFAULT_ASK_TIMEOUT_S = 10.0


def ask_timeout_s(target: Target) -> float:
    """How long one ask of the target's reconciler may take (see ``Target.timeout_s``)."""
    if target.timeout_s is not None:
        return target.timeout_s
    own = getattr(target.reconciler, "timeout_s", None)
    if isinstance(own, int | float) and not isinstance(own, bool) and own > 0:
        return float(own)
    return DEFAULT_ASK_TIMEOUT_S


Replay = Callable[[], Awaitable[Any]]


async def ask(
    effect: EffectView,
    target: Target,
    now_ms: int,
    *,
    declared: bool = True,
    replay: Replay | None = None,
    receipt_of: Callable[[Any], str] | None = None,
) -> tuple[Answer | None, str]:
    """Ask the destination whether the effect happened: (the answer, who answered). ``None`` means
    nobody could be asked (``judge`` escalates it). Never raises: a reconciler that fails or takes
    longer than ``ask_timeout_s(target)`` is an Unknown answer.

    Without a reconciler, a target that honours keys is asked by ``replay`` (the call again, with
    the same key, under the call's own deadline: it returns the original), while the destination
    still remembers the key; ``receipt_of`` names the receipt of what it returned. Only the agent
    holds the call: services pass none (see ``only_the_agent_can_ask``)."""
    if not declared:
        return Unknown(f"target {target.name!r} is not declared in the targets; nobody was asked"), "undeclared"
    if target.reconciler is not None:
        try:
            async with asyncio.timeout(ask_timeout_s(target)):
                return await target.reconciler.check(effect), target.reconciler.name
        except Exception as e:  # a reconciler that fails is an unknown answer, not a crash
            return Unknown(f"{type(e).__name__}: {e}"), target.reconciler.name
    if target.honours_keys and replay is not None and not retention_passed(effect, target, now_ms):
        try:
            value = await replay()
        except Exception as e:
            if target.rejects(e):
                return Absent(f"replay rejected: {e}"), "replay"
            return Unknown(f"replay failed: {type(e).__name__}: {e}"), "replay"
        return Found(receipt_of(value) if receipt_of is not None else "", value), "replay"
    return None, "none"


__all__ = ["CallableReconciler", "DEFAULT_ASK_TIMEOUT_S", "Replay", "ask", "ask_timeout_s"]
