"""A deterministic simulation of effect-ledger's protocol, on the real pure core.

One seed drives every random choice, so a run replays exactly (``python -m tests.sim --seed N
--trace``). Time is simulated and jumps; the log, the destinations, the agents' crashes and every
writer's clock sit behind this module, and the code under test is the real core: the fold
(``core.effect.apply``, ``expire``, ``claim_verdict``, ``uncertain_event``, ``decision_refusal``),
the per-call plan (``core.plan.plan``, ``after_answer``, ``conflict_with``) and the reconciliation
verdicts (``core.reconcile.judge``, ``next_check_ms``).

The world, per seed (FoundationDB's BUGGIFY: each fault site is switched on for some runs and
then fires at random):

* keys, each with a destination of one kind: it dedupes keys and answers lookups; it answers
  lookups only; or neither (nobody can ask it: a person decides);
* agent hosts executing each key through the plan, with the Kafka mode's claims (the processor's
  verdict before the call); they crash at any step and come back; two hosts may race with
  different requests;
* the log (one partition per key, the broker's clock is the true time); records are delayed,
  and delivered twice;
* the ledger processor folding the log with each record's log time, its timer proposing timeouts
  and re-publishing uncertain effects; a reconciler asking destinations; an operator who looks at
  the destination and declares ABSENT, through the refusal check or (``bypass``) straight to the log;
* every process with its own clock: skewed by up to hours, drifting.

A call lands at the destination after a latency; with ``late_landing`` up to its deadline plus the
target's ``lands_within_s`` (the declared bound; later than that it never lands).

``mode``: ``fixed`` runs the design as shipped (the processor folds with log times, every "now" a
decision compares is the log's, a lost claim is checked for a conflict); ``before`` runs it as it
was before that: the fold without log times, every process deciding on its own clock, and a lost
claim on a CONFIRMED key handed the winner's receipt. The invariants, after every step:

* no second execution at a destination that does not dedupe;
* no caller is handed a receipt for a request that is not its own;
and once faults stop and time has run out every window: the ledger's verdict agrees with the
destination (CONFIRMED only if it happened, ABSENT only if it did not), and every acknowledged
write is in the log.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from effect_ledger.core.effect import (
    REFUSED_CLAIM,
    Effect,
    absorb,
    apply,
    attempt_deadline,
    claim_of,
    claim_verdict,
    decision_refusal,
    expire,
    uncertain_event,
)
from effect_ledger.core.keys import digest, effect_key
from effect_ledger.core.model import (
    Decision,
    DecisionKind,
    Event,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    State,
    UncertainEffect,
)
from effect_ledger.core.plan import (
    AskFirst,
    CallSpec,
    Execute,
    Known,
    Refuse,
    ReturnReceipt,
    after_answer,
    conflict_with,
    plan,
)
from effect_ledger.core.reconcile import (
    Absent,
    Answer,
    Backoff,
    Found,
    Target,
    answered_too_early,
    judge,
    next_check_ms,
    view_of_uncertain,
)
from effect_ledger.errors import EffectConflict

T0 = 1_760_000_000_000
HOUR = 3_600_000
TIMEOUT_S = 5.0
LANDS_WITHIN_S = 2.0
FAULTS = (
    "skew_agent", "skew_reconciler", "skew_operator", "skew_processor", "late_landing", "crash_agent",
    "delay_log", "dup_log", "operator", "bypass", "race_requests",
)  # fmt: skip
KINDS = ("dedupes", "lookup", "neither")


class Violation(Exception):
    """An invariant broke: ``key`` names the effect, the message says which invariant."""

    def __init__(self, key: str, what: str) -> None:
        super().__init__(what)
        self.key = key
        self.what = what


@dataclass
class Clock:
    """A process's wall clock: the true time, skewed and drifting. Durations it measures are true
    (a monotonic clock): only the absolute reading is off."""

    skew_ms: int = 0
    drift_ppm: int = 0

    def read(self, t: int) -> int:
        return t + self.skew_ms + (t - T0) * self.drift_ppm // 1_000_000


@dataclass
class Destination:
    kind: str
    landed: list[tuple[str, int]] = field(default_factory=list)  # (request digest, true time)
    executions: int = 0

    def land(self, request_digest: str, t: int) -> None:
        if self.kind == "dedupes" and self.landed:
            return  # the same key again: the original result, no second effect
        self.landed.append((request_digest, t))
        self.executions += 1

    def lookup(self, key: str) -> Answer | None:
        if self.kind == "neither":
            return None
        if self.landed:
            return Found(f"dest:{key[-8:]}", {"id": f"dest:{key[-8:]}"})
        return Absent("no record of the key")


@dataclass
class Task:
    """One agent's ``execute`` of one key: its request, and where it stands."""

    key: str
    request: dict[str, Any]
    canonical: str
    digest: str
    step: str = "plan"  # plan | wait_claim | calling | done
    wake: int = T0
    intent: Intent | None = None
    call_end: int = 0  # true time its call returns (or times out)
    sent_t: int = 0  # true time it wrote its intent (its monotonic clock measures from there)
    lands_at: int | None = None
    outcome: str = ""


@dataclass
class Agent:
    name: str
    clock: Clock
    tasks: dict[str, Task] = field(default_factory=dict)
    down_until: int = 0
    seq: int = 0

    def event_id(self, kind: str) -> str:
        self.seq += 1
        return f"{self.name}-{kind}-{self.seq}"


class World:
    """One seed's run. ``step()`` advances the true time and lets every process act once."""

    def __init__(self, seed: int, mode: str = "fixed", steps: int = 240, faults: tuple[str, ...] | None = None) -> None:
        if mode not in ("fixed", "before"):
            raise ValueError(f"mode is fixed or before, not {mode!r}")
        self.seed, self.mode, self.steps = seed, mode, steps
        self.fixed = mode == "fixed"
        self.landings: list[tuple[int, int, str, str]] = []
        self.rng = rng = random.Random(seed)
        self.faults = {f for f in FAULTS if rng.random() < 0.45}
        if faults is not None:  # the same draws, then exactly these sites on
            self.faults = set(faults)
        self.t = T0
        self.trace: list[tuple[int, str, str]] = []
        self.seen: Counter[str] = Counter()  # "sometimes" assertions: rare paths reached
        self.target = Target("pay", lands_within_s=LANDS_WITHIN_S, backoff=Backoff(0.5, 2.0, 4.0, 4), retention_s=None)
        n_keys = rng.randint(1, 2)
        self.keys = [effect_key("pay", "refund", f"run-{seed}", f"step-{i}") for i in range(n_keys)]
        self.dest = {k: Destination(rng.choice(KINDS)) for k in self.keys}
        self.log: dict[str, list[tuple[int, Event]]] = {k: [] for k in self.keys}
        self.in_flight: list[tuple[int, int, str, Event]] = []
        self._n = 0
        # the processor
        self.proc_clock = self._clock("skew_processor")
        self.effects: dict[str, Effect | None] = {k: None for k in self.keys}
        self.cursor = {k: 0 for k in self.keys}
        self.published: set[str] = set()  # work items already published (by event id)
        self.work: list[tuple[int, int, UncertainEffect]] = []  # (log time, seq, item)
        self.rec_clock = self._clock("skew_reconciler")
        self.op_clock = self._clock("skew_operator")
        n_agents = rng.randint(1, 3)
        self.agents = [Agent(f"host{i}", self._clock("skew_agent") if i else Clock()) for i in range(n_agents)]
        for a in self.agents:
            for k in self.keys:
                if rng.random() < 0.8 or a is self.agents[0]:
                    req = {"order": k[-6:], "amount": 100}
                    if "race_requests" in self.faults and a is not self.agents[0] and rng.random() < 0.5:
                        req["amount"] = 200 + int(a.name[-1])
                    canonical = json.dumps(req, sort_keys=True, separators=(",", ":"))
                    a.tasks[k] = Task(k, req, canonical, digest(canonical), wake=T0 + rng.randint(0, 2000))
        self.acked: list[tuple[str, str]] = []  # (key, event id) of writes the log acknowledged

    # -- plumbing ------------------------------------------------------------------------------

    def _clock(self, fault: str) -> Clock:
        if fault not in self.faults:
            return Clock(self.rng.randint(-50, 50))  # NTP-grade: tens of milliseconds
        return Clock(
            self.rng.choice((-2, -1, 1, 2)) * HOUR + self.rng.randint(-60_000, 60_000), self.rng.randint(-200, 200)
        )

    def note(self, actor: str, what: str, key: str = "") -> None:
        self.trace.append((self.t - T0, actor, f"[{key[-4:]}] {what}" if key else what))

    def send(self, actor: str, ev: Event) -> None:
        """A write to the log: delivered after a delay (per writer in order), maybe twice."""
        delay = self.rng.randint(0, 400) if "delay_log" in self.faults else 0
        self._n += 1
        heapq.heappush(self.in_flight, (self.t + delay, self._n, actor, ev))
        if "dup_log" in self.faults and self.rng.random() < 0.15:
            self._n += 1
            heapq.heappush(self.in_flight, (self.t + delay + self.rng.randint(0, 800), self._n, actor, ev))
        self.note(actor, f"sends {type(ev).__name__} {ev.event_id[:24]} at_ms={ev.at_ms - T0}", ev.effect_id)

    def _deliver(self) -> None:
        while self.in_flight and self.in_flight[0][0] <= self.t:
            at, _, actor, ev = heapq.heappop(self.in_flight)
            self.log[ev.effect_id].append((at, ev))  # the broker stamps its append time
            self.acked.append((ev.effect_id, ev.event_id))

    def log_now(self) -> int:
        """The log's time: the broker's clock, what a process learns from its records (a record's
        append time plus what its monotonic clock measured since)."""
        return self.t

    # -- the processor ---------------------------------------------------------------------------

    def _fold(self) -> None:
        for k in self.keys:
            records = self.log[k]
            while self.cursor[k] < len(records):
                log_ms, ev = records[self.cursor[k]]
                self.cursor[k] += 1
                cur = self.effects[k]
                new, emitted = apply(cur, ev, log_ms) if self.fixed else apply(cur, ev)
                if new is cur and type(ev).__name__ == "Timeout" and cur is not None and not cur.has(ev.event_id):
                    self.seen["timeout not admitted"] += 1
                verdict = claim_verdict(new, ev) if new is not cur else None
                if verdict is not None and not self.fixed and verdict.intent_id == REFUSED_CLAIM:
                    # Before: the first intent of an attempt owned it, settled or not.
                    verdict = dataclasses.replace(verdict, intent_id=ev.event_id, worker=ev.worker)  # type: ignore[union-attr]
                if verdict is not None and verdict.intent_id == REFUSED_CLAIM:
                    self.seen["claim refused: the attempt before not settled"] += 1
                if verdict is not None:
                    new, more = apply(new, verdict, log_ms) if self.fixed else apply(new, verdict)
                    emitted = (*emitted, *more)
                self.effects[k] = new
                for u in emitted:
                    self._publish(u)

    def _publish(self, u: UncertainEffect) -> None:
        if u.event_id in self.published:
            return
        self.published.add(u.event_id)
        self._n += 1
        self.work.append((self.t, self._n, u))
        self.note("processor", f"publishes {u.event_id[:24]}", u.effect_id)

    def _timer(self) -> None:
        # The processor's log clock (its records' append times plus its monotonic clock since) can run
        # a little ahead of the broker's when the broker's clock is slewed: a timeout it proposes then
        # is taken before its deadline, and not admitted.
        now = self.log_now() + self.rng.choice((0, 0, 0, 40)) if self.fixed else self.proc_clock.read(self.t)
        for k in self.keys:
            e = self.effects[k]
            if e is None:
                continue
            for t in expire(e, now):
                self.send("processor", t)
            if e.state is State.UNCERTAIN and e.intent is not None:
                due = next_check_ms(e, self.target, now)
                if due is not None and due <= now:
                    self._publish(uncertain_event(e))

    # -- the reconciler --------------------------------------------------------------------------

    def _reconcile(self) -> None:
        keep = []
        for logged, n, u in self.work:
            if self.rng.random() < 0.3:  # the consumer is not always quick
                keep.append((logged, n, u))
                continue
            # Its "now": the work item's append time plus what it measured since (log mode), or its
            # own wall clock (writer mode).
            now = self.log_now() if self.fixed else self.rec_clock.read(self.t)
            answer = self.dest[u.effect_id].lookup(u.effect_id)
            r = judge(view_of_uncertain(u), self.target, answer, "reconciler", now)
            if answered_too_early(r):
                self.seen["absent while the call could still land"] += 1
            self.send("reconciler", r)
        self.work = keep

    # -- the operator ----------------------------------------------------------------------------

    def _operator(self) -> None:
        if "operator" not in self.faults or self.rng.random() > 0.05:
            return
        k = self.rng.choice(self.keys)
        e = self.effects[k]
        if e is None or e.state not in (State.UNCERTAIN, State.ESCALATED) or self.dest[k].landed:
            return  # a person declares ABSENT only when the destination shows nothing
        claimed = self.op_clock.read(self.t)
        if "bypass" not in self.faults:
            # ``effects resolve`` asks the broker's time, checks on it, and stamps the decision with it.
            now = self.log_now() if self.fixed else claimed
            refusal = decision_refusal(e, DecisionKind.ABSENT, now, self.target.lands_within_ms)
            if refusal is not None:
                self.seen["decision refused"] += 1
                return
            claimed = now
        d = Decision(f"op-{self._n}-{k[-4:]}", k, claimed, e.attempt, DecisionKind.ABSENT, "alice", "looked")
        self._n += 1
        self.send("operator", d)

    # -- the agents ------------------------------------------------------------------------------

    def _agent(self, a: Agent) -> None:
        if self.t < a.down_until:
            return
        for task in a.tasks.values():
            if task.step == "done" or self.t < task.wake:
                continue
            if "crash_agent" in self.faults and self.rng.random() < 0.04 and task.step != "plan":
                # kill -9: what it had in memory is gone; it comes back and executes again
                self.note(a.name, f"crashes in {task.step}", task.key)
                self.seen["agent crashed"] += 1
                task.step, task.intent = "plan", None
                a.down_until = self.t + self.rng.randint(100, 8000)
                task.wake = a.down_until
                return
            getattr(self, f"_agent_{task.step}")(a, task)

    def _view(self, task: Task) -> Effect | None:
        """What the agent learns about the key: the processor's facts (a lookup), once the log holds
        everything it wrote (the sync write it waited for), folded in its own file: without the log's
        times, which a lookup does not carry. What the log decides reaches it as the processor's claim
        verdicts."""
        e = self.effects[task.key]
        return absorb(None, list(e.facts))[0] if e is not None else None

    def _spec(self, task: Task) -> CallSpec:
        return CallSpec("pay", "refund", "default", "run", "step", task.canonical, task.digest, TIMEOUT_S)

    def _agent_plan(self, a: Agent, task: Task) -> None:
        if any(ev.effect_id == task.key and actor == a.name for _, _, actor, ev in self.in_flight):
            task.wake = self.t + 50  # its own writes are not folded yet: a sync writer waits
            return
        effect = self._view(task)
        # An agent plans on its own clock, against its file's facts (their writers' claims: a lookup
        # carries no log times); the log decides whether what it writes counts (the fold, the claim
        # verdicts).
        now = a.clock.read(self.t)
        known = Known(effect, None, None, now, a.name, None, True)
        step = plan(known, self._spec(task))
        if isinstance(step, AskFirst):
            assert effect is not None
            # What is already true, recorded first: by the agent's own clock (the SDK's), so the log
            # admits it only once its deadline has passed on the log's time.
            for t in expire(effect, a.clock.read(self.t)):
                effect, _ = apply(effect, t)
                self.send(a.name, t)
            answer = self.dest[task.key].lookup(task.key)
            r = judge(effect, self.target, answer, a.name, now)
            effect, _ = apply(effect, r)
            self.send(a.name, r)
            deadline = attempt_deadline(effect, effect.attempt) or 0
            until = self.target.may_still_land_until_ms(deadline) if answered_too_early(r) else deadline
            step = after_answer(step, effect, r, now, True, until)
        self._act(a, task, step)

    def _act(self, a: Agent, task: Task, step: Any) -> None:
        if isinstance(step, ReturnReceipt):
            self._returned(a, task, step.effect)
        elif isinstance(step, Refuse):
            if isinstance(step.error, EffectConflict):
                task.step, task.outcome = "done", "conflict"
                self.note(a.name, "EffectConflict", task.key)
            else:
                task.wake = self.t + self.rng.randint(300, 3000)
                self.note(a.name, f"refused: {type(step.error).__name__}", task.key)
        elif isinstance(step, Execute):
            claimed = a.clock.read(self.t)
            task.intent = Intent(
                a.event_id("intent"), task.key, claimed, step.attempt, "pay", "refund", "default", "run", "step",
                task.canonical, task.digest, claimed + int(TIMEOUT_S * 1000), a.name, True,
                self.target.lands_within_ms if self.fixed else None,
            )  # fmt: skip
            self.send(a.name, task.intent)
            task.step, task.wake, task.sent_t = "wait_claim", self.t + 10, self.t

    def _returned(self, a: Agent, task: Task, effect: Effect) -> None:
        first = effect.first_intent
        if first is not None and first.request_digest != task.digest:
            raise Violation(task.key, f"{a.name} was handed the receipt of another request")
        task.step, task.outcome = "done", "receipt"
        self.note(a.name, "returns the receipt", task.key)

    def _agent_wait_claim(self, a: Agent, task: Task) -> None:
        assert task.intent is not None
        effect = self.effects[task.key]
        verdict = (
            claim_of(effect, task.intent.attempt) if effect is not None and effect.has(task.intent.event_id) else None
        )
        if verdict is None:
            # The processor's answer comes back at once, or after a slow lookup.
            task.wake = self.t + (20 if self.rng.random() < 0.8 else self.rng.randint(1000, 6000))
            return
        if verdict.intent_id != task.intent.event_id:
            # A lost claim (the SDK's claims.settle): a conflict when the winner's request differs,
            # the winner's receipt when it is CONFIRMED, else in progress: try again later.
            self.seen["claim lost"] += 1
            conflict = conflict_with(effect, "pay", "refund", task.digest) if self.fixed else None
            if conflict is not None:
                self._act(a, task, Refuse(conflict))
            elif effect.state is State.CONFIRMED:
                self._returned(a, task, effect)
            else:
                task.step, task.wake = "plan", self.t + self.rng.randint(300, 2000)
            return
        # The claim is ours: call the destination with the key, within what is left of the intent's
        # timeout (measured on the agent's monotonic clock since it wrote the intent): a call that
        # outlived its deadline could land after reconcilers were told it cannot.
        left = int(TIMEOUT_S * 1000) - (self.t - task.sent_t) if self.fixed else int(TIMEOUT_S * 1000)
        if left <= 0:
            claimed = a.clock.read(self.t)
            i = task.intent
            self.send(
                a.name,
                Executed(
                    a.event_id("exec"),
                    task.key,
                    claimed,
                    i.attempt,
                    Outcome.FAILED,
                    "not called: the claim took the whole timeout",
                    claimed,
                    claimed,
                    None,
                    a.name,
                ),
            )
            self.seen["claim outlived the timeout"] += 1
            task.step, task.wake = "plan", self.t + self.rng.randint(100, 1000)
            return
        latency = self.rng.randint(5, 3000)
        if "late_landing" in self.faults and self.rng.random() < 0.4:
            latency = self.rng.randint(int(TIMEOUT_S * 1000), int((TIMEOUT_S + LANDS_WITHIN_S) * 1000))
            self.seen["late landing"] += 1
        if latency > left + int(LANDS_WITHIN_S * 1000):
            latency = None  # cut off at its deadline and past the declared bound: it never lands
        task.lands_at = self.t + latency if latency is not None else None
        task.call_end = self.t + min((latency or left) + self.rng.randint(1, 50), left)
        if task.lands_at is not None:
            heapq.heappush(self.landings, (task.lands_at, self._n, task.key, task.digest))
        self._n += 1
        task.step, task.wake = "calling", task.call_end
        self.note(a.name, f"calls, lands at +{latency} ms" if latency is not None else "calls, never lands", task.key)

    def _agent_calling(self, a: Agent, task: Task) -> None:
        assert task.intent is not None
        claimed = a.clock.read(self.t)
        i = task.intent
        if task.lands_at is not None and task.lands_at <= self.t:  # it returned: OK and the receipt
            self.send(
                a.name,
                Executed(
                    a.event_id("exec"), task.key, claimed, i.attempt, Outcome.OK, None, claimed, claimed, None, a.name
                ),
            )
            self.send(
                a.name,
                Receipt(
                    a.event_id("receipt"),
                    task.key,
                    claimed,
                    i.attempt,
                    f"dest:{task.key[-8:]}",
                    ReceiptSource.CALL,
                    '{"ok":true}',
                ),
            )
            task.step, task.outcome = "done", "called"
            self.note(a.name, "call returned OK", task.key)
        else:  # timed out: the outcome is unknown, and the call may still land
            self.send(
                a.name,
                Executed(
                    a.event_id("exec"),
                    task.key,
                    claimed,
                    i.attempt,
                    Outcome.UNKNOWN,
                    "timed out",
                    claimed,
                    claimed,
                    None,
                    a.name,
                ),
            )
            task.step, task.wake = "plan", self.t + self.rng.randint(500, 4000)
            self.note(a.name, "call timed out", task.key)

    # -- the run ---------------------------------------------------------------------------------

    def _land(self) -> None:
        while self.landings and self.landings[0][0] <= self.t:
            _, _, key, request_digest = heapq.heappop(self.landings)
            self.dest[key].land(request_digest, self.t)
            self.note("destination", f"a call lands ({self.dest[key].kind})", key)

    def _check(self) -> None:
        for k, d in self.dest.items():
            if d.kind != "dedupes" and d.executions > 1:
                raise Violation(k, f"executed {d.executions} times at a destination that does not dedupe ({d.kind})")

    def step(self) -> None:
        self.t += self.rng.choice((self.rng.randint(1, 200), self.rng.randint(200, 1500), self.rng.randint(1500, 6000)))
        self._deliver()
        self._land()
        self._fold()
        self._timer()
        self._reconcile()
        self._operator()
        for a in self.agents:
            self._agent(a)
        self._check()

    def run(self) -> None:
        for _ in range(self.steps):
            self.step()
        # Faults stop: no crashes, no operator; time runs past every window and everything settles.
        self.faults -= {"crash_agent", "operator", "bypass"}
        for _ in range(200):
            self.step()
            if (
                not self.in_flight
                and not self.work
                and all(t.step == "done" for a in self.agents for t in a.tasks.values())
            ):
                break
        self._settled()

    def _settled(self) -> None:
        for k in self.keys:
            e = self.effects[k]
            d = self.dest[k]
            state = e.state if e is not None else None
            if state is State.CONFIRMED and not d.landed:
                raise Violation(k, "CONFIRMED but the destination has no record")
            if state is State.ABSENT and d.landed:
                raise Violation(k, "ABSENT but it happened at the destination")
            # A timeout command the log took too early is not admitted, by design; anything else
            # the log acknowledged is a fact of the ledger.
            held = {f.event_id for f in e.facts} if e is not None else set()
            lost = [eid for key, eid in self.acked if key == k and eid not in held and not eid.startswith("timeout:")]
            if lost:
                raise Violation(k, f"acknowledged writes missing from the ledger: {lost[:3]}")


def run_seed(seed: int, mode: str = "fixed", steps: int = 240, faults: tuple[str, ...] | None = None) -> World:
    """Run one seed; raises ``Violation`` (with the world on it as ``.world``) when an invariant breaks."""
    w = World(seed, mode, steps, faults)
    try:
        w.run()
    except Violation as v:
        v.world = w  # type: ignore[attr-defined]
        raise
    return w
