"""The embedded runner: the in-process counterpart of the Kafka ledger processor.

On every tick it (1) fires deadlines: an attempt still PENDING (or EXECUTED without a receipt)
after its deadline plus a grace gets a Timeout event and becomes UNCERTAIN; (2) reconciles
UNCERTAIN effects whose backoff has elapsed: found -> CONFIRMED, absent -> ABSENT, unknown ->
retried with backoff, then ESCALATED (see ``effect_ledger.core.reconcile.judge``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import OPEN_STATES, State
from effect_ledger.core.reconcile import next_check_ms, only_the_agent_can_ask, target_for, target_name
from effect_ledger.metrics import logs
from effect_ledger.metrics.effects import EffectWatch
from effect_ledger.metrics.logs import DEFAULT_SUMMARY_S, Summary
from effect_ledger.sdk.ledger import Ledger

log = logging.getLogger("effect_ledger.runner")


@dataclass
class TickReport:
    timed_out: list[str] = field(default_factory=list)
    reconciled: dict[str, str] = field(default_factory=dict)  # key -> state after asking

    def __bool__(self) -> bool:
        return bool(self.timed_out or self.reconciled)


class Runner:
    """Fires deadlines and runs reconcilers for one ledger. ``grace_ms`` is added to a deadline
    before it fires: the call's own timeout ends it at the deadline, the grace covers the time to
    record its outcome."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        interval: float = 0.5,
        grace_ms: int = 1000,
        batch: int = 500,
        metrics: Any = None,
        metrics_every: float = 5.0,
        summary_every: float = DEFAULT_SUMMARY_S,
    ) -> None:
        self.ledger = ledger
        self.interval = interval
        self.grace_ms = grace_ms
        self.batch = batch
        # A LedgerMetrics (effect_ledger.metrics.names): counters move where the runner already
        # handles the effect; the gauges are one GROUP BY every ``metrics_every`` seconds.
        self.metrics = metrics
        self.metrics_every = metrics_every
        self._gauges_at: float | None = None
        # Every change of the file this process writes is counted and said once (the SDK's watch
        # on the same metrics, in the same process, is replaced by this one: not counted twice).
        self.summary = Summary(log, summary_every)
        self.watch = EffectWatch(metrics, log, self.summary)
        ledger.store.observe(id(metrics) if metrics is not None else self, self.watch)

    async def tick(self) -> TickReport:
        report = TickReport()
        store = self.ledger.store
        now = self.ledger.now_ms()
        due = await store.due_deadlines(now - self.grace_ms, self.batch)
        for key, deadline in due:
            after = await self.ledger.expire(key)
            if after is not None and after.state is State.UNCERTAIN:
                report.timed_out.append(key)
                if self.metrics is not None:
                    self.metrics.detection_latency.observe(max(0, self.ledger.now_ms() - deadline) / 1000)
        uncertain = await store.due_checks(now, self.batch)
        for key, tries_so_far in uncertain:
            effect = await self.ledger.get(key)
            if effect is None:
                continue
            name = target_name(effect)
            target, _ = target_for(self.ledger.targets, name)  # undeclared: asked as unknown
            if only_the_agent_can_ask(effect, target, now):
                # Only the agent, which holds the call, can ask this destination (by replaying the
                # key). Look again when its retention is over, then escalate.
                await store.record_check(key, tries_so_far, next_check_ms(effect, target, now))
                continue
            after = await self.ledger.reconcile(key)
            if after is None:
                continue
            report.reconciled[key] = after.state.value
            verdict = _verdict(after)
            self.summary.count(f"verdicts_{verdict}")
            logs.event(
                log, "verdict", f"effect {key}: reconciler answered {verdict}, now {after.state.value}",
                effect_id=key, target=name, verdict=verdict, state=after.state.value,
            )  # fmt: skip
            if self.metrics is not None:
                self.metrics.resolutions.labels(verdict=verdict).inc()
            if after.state is State.UNCERTAIN:
                # Asked again after the target's backoff: the processor's rule in Kafka mode too.
                later = self.ledger.now_ms()
                await store.record_check(key, tries_so_far + 1, next_check_ms(after, target, later) or later)
        if self.metrics is not None:
            await self._refresh_gauges(now)
        self.summary.tick()
        return report

    async def _refresh_gauges(self, now: int) -> None:
        """Effects by state and target, the open ones and the most overdue: read from the
        ``effects`` table at most every ``metrics_every`` seconds."""
        clock = asyncio.get_running_loop().time()
        if self._gauges_at is not None and clock - self._gauges_at < self.metrics_every:
            return
        self._gauges_at = clock
        m = self.metrics
        counts = await self.ledger.store.counts()
        m.effects.clear()  # a (state, target) pair that emptied must read 0, not its last count
        open_ = 0
        for state, target, n in counts:
            m.effects.labels(state=state, target=target).set(n)
            if state in OPEN_STATES:
                open_ += n
        m.open_effects.set(open_)
        due = await self.ledger.store.oldest_due_ms()
        m.oldest_overdue.set(max(0, now - due) / 1000 if due is not None else 0)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:  # one bad tick must not stop deadline detection for good
                log.exception("runner tick failed; retrying")
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except TimeoutError:
                pass


def _verdict(effect: Effect) -> str:
    resolutions = effect.resolutions
    return resolutions[-1].verdict.value if resolutions else effect.state.value
