"""The producer SDK: ``Ledger``, the object an agent calls around every external write.

    ledger = await Ledger.open("effects.db")
    receipt = await ledger.execute(
        target="payments", operation="refund.create",
        run_id=run.id, step="refund-order-123",
        request={"order": "123", "amount": 4800, "currency": "CNY"},
        call=lambda key: gateway.refund("123", 4800, idempotency_key=key),
        timeout=10.0,
    )

Per call, before the destination is touched, ``execute`` looks at what is known about the key:

* CONFIRMED -> the recorded receipt is returned; the destination is not called.
* PENDING / EXECUTED / UNCERTAIN from an earlier attempt -> if a live worker holds it,
  ``EffectInProgress``; otherwise reconcile first (ask the target's reconciler, or replay the key
  to a destination that honours keys): found -> return it; absent -> execute with the same key;
  unknown -> ``EffectUncertain``, nothing is sent.
* ESCALATED -> ``EffectUncertain`` until a person decides; ABANDONED / COMPENSATED -> ``EffectClosed``.
* FAILED / ABSENT / nothing -> the intent is written durably (claiming the key in the same
  statement), then the destination is called with the key under the recorded deadline.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from streams import crashpoints
from streams.effect import Effect, expire
from streams.errors import (
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectUncertain,
    InvalidEffect,
    LedgerClosed,
)
from streams.keys import DEFAULT_NAMESPACE, canonical_json, check_key, check_name, digest, effect_key
from streams.model import (
    OPEN_STATES,
    Decision,
    DecisionKind,
    Event,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    State,
    Verdict,
)
from streams.reconcile import Absent, Answer, Found, Target, Unknown, judge, retention_passed, view
from streams.store import Claim, ClaimOp, Durability, Store, VersionConflict, owner_alive, worker_identity

Call = Callable[[str], Any]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
_CONFLICT_RETRIES = 16


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What ``execute`` returns: the destination's receipt for the effect."""

    effect_id: str
    receipt_id: str
    value: Any  # what the destination returned (decoded JSON)
    source: ReceiptSource
    attempt: int
    called: bool  # True when this call executed it; False when it was already recorded


def _json_text(value: Any) -> str:
    try:
        return canonical_json(value)
    except InvalidEffect:
        return json.dumps(value, default=str, sort_keys=True, separators=(",", ":"))


def _confirmation(effect: Effect, called: bool) -> Confirmation:
    r = effect.receipt
    assert r is not None
    return Confirmation(effect.effect_id, r.receipt_id, json.loads(r.value), r.source, r.attempt, called)


class Ledger:
    """An effect ledger on one SQLite file (embedded mode). Safe to share between tasks of one event
    loop; several processes may open the same file."""

    def __init__(self, store: Store, clock: Callable[[], int], default_timeout: float, namespace: str) -> None:
        self._store = store
        self._clock = clock
        self._default_timeout = default_timeout
        self._namespace = namespace
        self._targets: dict[str, Target] = {}
        self._inflight: set[str] = set()
        self.worker = worker_identity()

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        durability: Durability | str = Durability.NORMAL,
        targets: tuple[Target, ...] | list[Target] = (),
        clock: Callable[[], int] = wall_clock_ms,
        default_timeout: float = 10.0,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> Ledger:
        """Open (or create) the ledger file. ``durability``: NORMAL survives a killed process, FULL
        survives power loss too (an fsync per write). ``clock`` returns epoch milliseconds."""
        store = await Store.open(path, Durability(durability))
        ledger = cls(store, clock, default_timeout, namespace)
        for t in targets:
            ledger.register(t)
        return ledger

    async def __aenter__(self) -> Ledger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._store.close()

    @property
    def store(self) -> Store:
        return self._store

    def now_ms(self) -> int:
        return self._clock()

    def register(self, target: Target) -> None:
        check_name("target", target.name)
        self._targets[target.name] = target

    def target(self, name: str) -> Target:
        return self._targets.get(name) or Target(name)

    # -- the per-call decision ---------------------------------------------------------------

    async def execute(
        self,
        *,
        target: str,
        operation: str,
        request: Any,
        call: Call,
        run_id: str | None = None,
        step: str | None = None,
        key: str | None = None,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> Confirmation:
        """Execute one external write at most once. ``call(key)`` is the write itself; it receives
        the idempotency key to hand to the destination. Give ``run_id`` and ``step`` (the key is
        derived from them, see ``streams.keys.effect_key``) or your own ``key``."""
        if self._store.closed:
            raise LedgerClosed(f"ledger {self._store.path} is closed")
        check_name("target", target)
        check_name("operation", operation)
        ns = namespace or self._namespace
        if key is None:
            if run_id is None or step is None:
                raise InvalidEffect("give run_id and step (the key is derived from them), or key")
            key = effect_key(target, operation, run_id, step, ns)
        else:
            check_key(key)
        canonical = canonical_json(request)
        t_s = self._default_timeout if timeout is None else timeout
        if not isinstance(t_s, int | float) or not 0 < t_s <= 7 * 24 * 3600:
            raise InvalidEffect(f"timeout must be a number of seconds > 0, got {t_s!r}")
        if not callable(call):
            raise InvalidEffect("call must be a function of the idempotency key")
        if key in self._inflight:
            raise EffectInProgress(key, "another task of this worker is executing it")
        self._inflight.add(key)
        try:
            spec = _Spec(target, operation, ns, run_id or "", step or "", canonical, digest(canonical), float(t_s))
            for _ in range(_CONFLICT_RETRIES):
                try:
                    return await self._execute_once(key, spec, call)
                except VersionConflict:
                    continue
            raise EffectInProgress(key, "the effect kept changing under this worker; try again")
        finally:
            self._inflight.discard(key)

    async def _execute_once(self, key: str, spec: _Spec, call: Call) -> Confirmation:
        loaded = await self._store.load(key)
        effect = loaded.effect
        observed_owner: str | None = None
        if effect is not None:
            self._check_same_request(effect, spec)
            if effect.state is State.CONFIRMED:
                return _confirmation(effect, called=False)
            if effect.state in (State.ABANDONED, State.COMPENSATED):
                raise EffectClosed(key, effect.state.value, effect.reason)
            if effect.state is State.ESCALATED:
                raise EffectUncertain(key, effect.reason or "escalated: a person must decide", effect.state.value)
            if effect.state in OPEN_STATES:
                effect = await self._resolve_earlier(effect, loaded.claim, spec, call)
                if effect.state is State.CONFIRMED:
                    return _confirmation(effect, called=False)
                observed_owner = loaded.claim.owner
            # FAILED or ABSENT: nothing happened at the destination; execute with the same key.
        return await self._run_attempt(key, effect, spec, call, observed_owner)

    def _check_same_request(self, effect: Effect, spec: _Spec) -> None:
        first = effect.first_intent
        if first is None:
            return
        if first.request_digest != spec.digest or first.target != spec.target or first.operation != spec.operation:
            given = (
                digest(f"{spec.target}\0{spec.operation}\0{spec.canonical}")
                if (first.target != spec.target or first.operation != spec.operation)
                else spec.digest
            )
            raise EffectConflict(effect.effect_id, first.request_digest, given)

    async def _resolve_earlier(self, effect: Effect, claim: Claim, spec: _Spec, call: Call) -> Effect:
        """An earlier attempt is open. Returns the effect CONFIRMED or ABSENT, or raises."""
        now = self._clock()
        if claim.owner is not None and claim.owner != self.worker:
            alive = owner_alive(claim.owner)
            leased = claim.until_ms is not None and now < claim.until_ms
            if alive or (alive is None and leased):
                retry = (claim.until_ms - now) if claim.until_ms else None
                raise EffectInProgress(
                    effect.effect_id, f"worker {claim.owner} is executing attempt {effect.attempt}", retry
                )
        target = self.target(spec.target)
        answer, name = await self._ask(effect, target, call, spec.timeout)
        now = self._clock()
        resolution = judge(effect, target, answer, name, now)
        effect = await self._record(effect, [resolution])
        if effect.state in (State.CONFIRMED, State.ABSENT):
            return effect
        if resolution.verdict is Verdict.UNKNOWN and effect.intent and now < effect.intent.deadline_ms:
            raise EffectInProgress(effect.effect_id, resolution.reason, effect.intent.deadline_ms - now)
        raise EffectUncertain(effect.effect_id, resolution.reason, effect.state.value)

    async def _ask(
        self, effect: Effect, target: Target, call: Call | None, timeout: float
    ) -> tuple[Answer | None, str]:
        """Ask the destination whether the effect happened. A target without a reconciler that
        honours keys is asked by replaying the call with the same key (it returns the original)."""
        if target.reconciler is not None:
            try:
                async with asyncio.timeout(timeout):
                    return await target.reconciler.check(view(effect)), target.reconciler.name
            except Exception as e:  # a reconciler that fails is an unknown answer, not a crash
                return Unknown(f"{type(e).__name__}: {e}"), target.reconciler.name
        if target.honours_keys and call is not None and not retention_passed(effect, target, self._clock()):
            try:
                async with asyncio.timeout(timeout):
                    value = await _maybe_await(call(effect.effect_id))
            except target.definite as e:
                return Absent(f"replay rejected: {e}"), "replay"
            except Exception as e:
                return Unknown(f"replay failed: {type(e).__name__}: {e}"), "replay"
            return Found(self._receipt_id(target, value), value), "replay"
        return None, "none"

    async def reconcile(self, key: str, call: Call | None = None) -> Effect | None:
        """Ask once about an open effect (used by the runner); records and returns the outcome."""
        effect = (await self._store.load(key)).effect
        if effect is None or effect.state not in OPEN_STATES:
            return effect
        target = self.target(effect.intent.target if effect.intent else key.split(":", 1)[0])
        answer, name = await self._ask(effect, target, call, self._default_timeout)
        return await self._record(effect, [judge(effect, target, answer, name, self._clock())])

    async def _run_attempt(
        self, key: str, before: Effect | None, spec: _Spec, call: Call, observed_owner: str | None
    ) -> Confirmation:
        crashpoints.reached(crashpoints.BEFORE_INTENT)
        now = self._clock()
        attempt = before.attempt + 1 if before else 1
        deadline = now + int(spec.timeout * 1000)
        intent = Intent(
            event_id=uuid.uuid4().hex,
            effect_id=key,
            at_ms=now,
            attempt=attempt,
            target=spec.target,
            operation=spec.operation,
            namespace=spec.namespace,
            run_id=spec.run_id,
            step=spec.step,
            request=spec.canonical,
            request_digest=spec.digest,
            deadline_ms=deadline,
            worker=self.worker,
        )
        # The claim lives until the deadline: past it, the call cannot still be running here.
        effect, _ = await self._store.append(
            before,
            [intent],
            now_ms=now,
            claim_op=ClaimOp.TAKE,
            owner=self.worker,
            claim_until_ms=deadline,
            observed_owner=observed_owner,
        )
        crashpoints.reached(crashpoints.AFTER_INTENT)
        target = self.target(spec.target)
        started = self._clock()
        try:
            async with asyncio.timeout(spec.timeout):
                value = await _maybe_await(call(key))
        except target.definite as e:
            await self._outcome(effect, attempt, Outcome.FAILED, f"{type(e).__name__}: {e}", started)
            raise
        except BaseException as e:
            # A timeout, a transport error, an unexpected exception, a cancelled task: the request
            # may or may not have reached the destination.
            what = "timed out" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            await asyncio.shield(self._outcome(effect, attempt, Outcome.UNKNOWN, what, started))
            if isinstance(e, Exception):
                raise EffectUncertain(key, f"call outcome unknown ({what})", State.UNCERTAIN.value) from e
            raise
        crashpoints.reached(crashpoints.AFTER_CALL)
        effect = await self._outcome(effect, attempt, Outcome.OK, None, started)
        crashpoints.reached(crashpoints.AFTER_EXECUTED)
        now = self._clock()
        receipt = Receipt(
            uuid.uuid4().hex, key, now, attempt, self._receipt_id(target, value), ReceiptSource.CALL, _json_text(value)
        )
        effect = await self._record(effect, [receipt])
        return _confirmation(effect, called=True)

    async def _outcome(self, effect: Effect, attempt: int, outcome: Outcome, error: str | None, started: int) -> Effect:
        now = self._clock()
        ev = Executed(uuid.uuid4().hex, effect.effect_id, now, attempt, outcome, error, started, now, None, self.worker)
        return await self._record(effect, [ev], claim_op=ClaimOp.RELEASE)

    async def _record(self, before: Effect | None, events: list[Event], claim_op: ClaimOp = ClaimOp.KEEP) -> Effect:
        """Write events that must land whatever else happened to the effect meanwhile (a runner's
        timeout, a webhook's receipt): on a version conflict, reload and fold again."""
        for _ in range(_CONFLICT_RETRIES):
            try:
                effect, _ = await self._store.append(before, events, now_ms=self._clock(), claim_op=claim_op)
                return effect
            except VersionConflict:
                before = (await self._store.load(events[0].effect_id)).effect
        raise EffectInProgress(events[0].effect_id, "could not record: the effect kept changing")

    @staticmethod
    def _receipt_id(target: Target, value: Any) -> str:
        if target.receipt_id is not None:
            return str(target.receipt_id(value))
        if isinstance(value, dict) and value.get("id") is not None:
            return str(value["id"])
        return "sha256:" + digest(_json_text(value))[:32]

    # -- later facts -------------------------------------------------------------------------

    async def expire(self, key: str) -> Effect | None:
        """Fire the effect's deadline if it has passed (a Timeout event: it becomes UNCERTAIN)."""
        effect = (await self._store.load(key)).effect
        if effect is None:
            return None
        timeouts = expire(effect, self._clock())
        return await self._record(effect, list(timeouts)) if timeouts else effect

    async def record_receipt(
        self,
        key: str,
        receipt_id: str,
        value: Any = None,
        *,
        source: ReceiptSource = ReceiptSource.WEBHOOK,
        attempt: int = 0,
    ) -> Effect:
        """Record a receipt that arrives after the call (a webhook). ``attempt`` 0: unknown."""
        check_key(key)
        if not receipt_id:
            raise InvalidEffect("receipt_id must be a non-empty string")
        before = (await self._store.load(key)).effect
        ev = Receipt(
            uuid.uuid4().hex, key, self._clock(), attempt, receipt_id, ReceiptSource(source), _json_text(value)
        )
        return await self._record(before, [ev])

    async def decide(
        self, key: str, decision: DecisionKind | str, *, by: str, reason: str, receipt_id: str | None = None
    ) -> Effect:
        """Record a person's decision on an effect (usually an escalated one)."""
        check_key(key)
        if not by or not reason:
            raise InvalidEffect("a decision needs who made it (by) and why (reason)")
        kind = DecisionKind(decision)
        before = (await self._store.load(key)).effect
        if before is None:
            raise InvalidEffect(f"no effect with key {key!r} in {self._store.path}")
        ev = Decision(uuid.uuid4().hex, key, self._clock(), before.attempt, kind, by, reason, receipt_id)
        return await self._record(before, [ev])

    async def get(self, key: str) -> Effect | None:
        return (await self._store.load(key)).effect

    # -- decorator form ----------------------------------------------------------------------

    def effect(
        self,
        *,
        target: str,
        operation: str | None = None,
        timeout: float | None = None,
        key_arg: str = "idempotency_key",
    ) -> Callable[[F], Callable[..., Awaitable[Any]]]:
        """Wrap an async function that performs one external write and accepts the idempotency key
        as the keyword ``key_arg``. The wrapped function takes ``run_id=`` and ``step=`` (or
        ``key=``) on top of its own arguments, which form the request; it returns what the
        destination returned, from the call or from the record."""

        def wrap(fn: F) -> Callable[..., Awaitable[Any]]:
            op = operation or fn.__name__.replace("_", ".")
            check_name("operation", op)
            sig = inspect.signature(fn)
            if key_arg not in sig.parameters:
                raise InvalidEffect(f"{fn.__name__} must accept the idempotency key as keyword {key_arg!r}")

            @functools.wraps(fn)
            async def wrapper(
                *args: Any, run_id: str | None = None, step: str | None = None, key: str | None = None, **kwargs: Any
            ) -> Any:
                bound = sig.bind_partial(*args, **kwargs)
                bound.apply_defaults()
                request = {k: v for k, v in bound.arguments.items() if k != key_arg}
                confirmation = await self.execute(
                    target=target,
                    operation=op,
                    request=request,
                    run_id=run_id,
                    step=step,
                    key=key,
                    timeout=timeout,
                    call=lambda k: fn(*args, **{**kwargs, key_arg: k}),
                )
                return confirmation.value

            return wrapper

        return wrap


@dataclass(frozen=True, slots=True)
class _Spec:
    target: str
    operation: str
    namespace: str
    run_id: str
    step: str
    canonical: str
    digest: str
    timeout: float


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


__all__ = ["Ledger", "Confirmation", "Target", "Durability", "Found", "Absent", "Unknown"]
