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

Inputs are checked before anything is written (names, key, ids, a JSON request within
``limits.MAX_REQUEST_BYTES``): ``InvalidEffect`` / ``EffectTooLarge``, nothing written or called.
After the call, its outcome is recorded whatever it returned: a value that is not JSON or too
large is kept as a flagged representation (INEXACT_RECEIPT) and the caller gets
``ReceiptNotRecordable`` carrying the confirmation; an outcome the store cannot write (a full disk)
gives ``EffectUncertain`` chained to the ``StorageError``, the intent left open for reconciliation.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from effect_ledger.streams import claims, crashpoints
from effect_ledger.streams.codec import DecodeError
from effect_ledger.streams.config import KafkaConfig, operator_identity
from effect_ledger.streams.effect import Effect, decision_refusal, expire
from effect_ledger.streams.errors import (
    DecisionRefused,
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectUncertain,
    InvalidEffect,
    LedgerClosed,
    LedgerUnavailable,
    ReceiptNotRecordable,
    StorageError,
    UnknownEffect,
    UnknownTarget,
)
from effect_ledger.streams.extras import require
from effect_ledger.streams.keys import (
    DEFAULT_NAMESPACE,
    canonical_request,
    check_ids,
    check_key,
    check_name,
    digest,
    effect_key,
)
from effect_ledger.streams.limits import (
    MAX_RECEIPT_ID_BYTES,
    bounded_text,
    check_text,
    digest_id,
    receipt_text,
    show,
)
from effect_ledger.streams.model import (
    INEXACT_PREFIX,
    OPEN_STATES,
    Decision,
    DecisionKind,
    Event,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    Verdict,
    is_event,
)
from effect_ledger.streams.reconcile import Absent, Answer, Found, Target, Unknown, judge, retention_passed, view
from effect_ledger.streams.store import (
    Claim,
    ClaimOp,
    Durability,
    Loaded,
    LocalWorker,
    Store,
    VersionConflict,
    owner_alive,
)
from effect_ledger.streams.targets import TargetsSpec
from effect_ledger.streams.targets import resolve as resolve_targets

if TYPE_CHECKING:
    from effect_ledger.streams.lookup import ProcessorLookup
    from effect_ledger.streams.relay import Relay

log = logging.getLogger("effect_ledger.sdk")

Call = Callable[[str], Any]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
_CONFLICT_RETRIES = 16


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def new_event_id() -> str:
    """32 hex characters, time-ordered (48-bit ms, then 80 random bits): unique like a uuid4, and
    kind to the event_id index, where random keys would scatter every insert."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What ``execute`` returns: the destination's receipt for the effect."""

    effect_id: str
    receipt_id: str
    value: Any  # what the destination returned (decoded JSON)
    source: ReceiptSource
    attempt: int
    called: bool  # True when this call executed it; False when it was already recorded
    # False when the recorded value is a representation (``{"effect_ledger.inexact": ...}``): the
    # destination returned something that is not JSON, or too large (see ``limits.receipt_text``).
    exact: bool = True


def _confirmation(effect: Effect, called: bool) -> Confirmation:
    r = effect.receipt
    assert r is not None
    exact = not r.value.startswith(INEXACT_PREFIX)
    return Confirmation(effect.effect_id, r.receipt_id, json.loads(r.value), r.source, r.attempt, called, exact)


def receipt_of(target: Target, value: Any) -> tuple[str, str, str | None]:
    """(receipt id, recorded JSON text, what could not be recorded exactly or None) for what a call
    returned. Never raises: the call already happened, so its record must not depend on its value.
    The id is the target's ``receipt_id(value)``, else the value's ``"id"``, else (and whenever
    those fail or give no usable id) the digest of the recorded text."""
    text, problem = receipt_text(value)
    try:
        if target.receipt_id is not None:
            rid: Any = target.receipt_id(value)
        elif isinstance(value, dict) and value.get("id") is not None:
            rid = value["id"]
        else:
            return digest_id(text), text, problem
        rid = check_text("receipt id", str(rid), MAX_RECEIPT_ID_BYTES)
    except Exception as e:  # the target's function, a str() or a lookup that raises
        why = f"receipt id not found ({type(e).__name__}: {bounded_text(str(e), 256)}); using the value's digest"
        return digest_id(text), text, f"{problem}; {why}" if problem else why
    return rid, text, problem


class Ledger:
    """An effect ledger on one SQLite file (embedded mode). Safe to share between tasks of one event
    loop; several processes may open the same file."""

    def __init__(self, store: Store, clock: Callable[[], int], default_timeout: float, namespace: str) -> None:
        self._store = store
        self._clock = clock
        self._default_timeout = default_timeout
        self._namespace = namespace
        self._targets: dict[str, Target] = {}
        # Who this ledger object is to claims, and the keys it is executing: another ledger of this
        # process treats its claims as live only while it is open and has the key in flight.
        self._local = LocalWorker()
        self._inflight = self._local.in_flight
        self.worker = self._local.identity
        self._relay: Relay | None = None
        self._sync = False
        self._sync_timeout = 10.0
        self._lookup: ProcessorLookup | None = None
        self._metrics_server: Any = None  # Ledger.open(metrics_port=...): shut down by close

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        durability: Durability | str = Durability.NORMAL,
        targets: TargetsSpec = None,
        clock: Callable[[], int] = wall_clock_ms,
        default_timeout: float = 10.0,
        namespace: str = DEFAULT_NAMESPACE,
        kafka: KafkaConfig | str | None = None,
        sync: bool = False,
        sync_timeout: float = 10.0,
        lookup: str | None = None,
        lookup_token: str | None = None,
        metrics: Any = None,
        metrics_port: int | None = None,
    ) -> Ledger:
        """Open (or create) the ledger file.

        ``targets``: the destinations this ledger may call, declared once (see
        ``effect_ledger.streams.targets``): a targets TOML file, ``module:NAME``, a list of
        ``Target``, or ``None`` for the file named by ``EFFECTS_TARGETS``. ``execute`` on a target
        that is not declared raises ``UnknownTarget``.

        ``durability``: NORMAL survives a killed process, FULL survives power loss too (an fsync per
        write). ``clock`` returns epoch milliseconds.

        Kafka mode: with ``kafka`` (a ``KafkaConfig`` or bootstrap servers) the file is also an
        outbox, relayed to ``effects.events`` by a task of this event loop. ``sync=True`` waits for
        the broker to acknowledge the intent before the destination is called (at most
        ``sync_timeout`` s; then the effect is FAILED without a call). ``lookup`` is the ledger
        processor's URL: a key this file does not know, or knows only as open, is looked up there
        first, so an agent restarted on another host sees what its predecessor did. With ``kafka``,
        ``sync=True`` and ``lookup``, agents on several hosts may race for a key: after Kafka
        acknowledged the intent, the destination is called only once the processor has answered,
        for that intent's offset, that it is the first intent of its attempt in the key's partition
        (``effect_ledger.streams.claims``); otherwise ``EffectInProgress``, or the winner's receipt
        once there is one.
        ``lookup_token`` is the processor's lookup token (``effects worker --web-token``), by default
        ``$EFFECTS_WEB_TOKEN``. Kafka mode needs the ``[kafka]`` extra (confluent-kafka): without
        it, ``MissingExtra`` is raised before the file is opened.

        Metrics (the ``[metrics]`` extra): ``metrics`` is an
        ``effect_ledger.streams.metrics.LedgerMetrics`` the relay updates (outbox depth, dead
        letters) on the application's own registry, to serve as it likes; ``metrics_port`` serves
        one on ``127.0.0.1:PORT/metrics`` until ``close``.
        """
        declared = resolve_targets(targets)  # a bad declaration fails before the file is touched
        if kafka is not None:
            require("kafka", "Ledger.open(kafka=...)")  # likewise a missing Kafka client
        server = None
        if metrics_port is not None:
            from effect_ledger.streams.metrics import LedgerMetrics

            if metrics is None:
                metrics = LedgerMetrics(feature="Ledger.open(metrics_port=...)")
            server = metrics.serve(metrics_port)
        store = await Store.open(path, Durability(durability))
        ledger = cls(store, clock, default_timeout, namespace)
        ledger._metrics_server = server
        for t in declared:
            ledger.register(t)
        if kafka is not None:
            from effect_ledger.streams.relay import Relay

            cfg = kafka if isinstance(kafka, KafkaConfig) else KafkaConfig.from_env(bootstrap=kafka)
            ledger._relay = Relay(store, cfg, metrics=metrics)
            ledger._relay.start()
        ledger._sync = sync
        ledger._sync_timeout = sync_timeout
        if lookup is not None:
            from effect_ledger.streams.lookup import ProcessorLookup

            # With Kafka, a lookup names the offsets it waits for (claims.Watermarks): no broker
            # round trip on the processor's side.
            marks = claims.Watermarks(ledger._relay.cfg) if ledger._relay is not None else None
            ledger._lookup = ProcessorLookup(
                lookup,
                token=lookup_token,
                watermarks=marks.of if marks else None,
                on_close=marks.close if marks else None,
            )
        return ledger

    async def __aenter__(self) -> Ledger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, relay_timeout: float = 10.0) -> None:
        """Give the relay up to ``relay_timeout`` seconds to send what is left (events not yet
        acknowledged stay in the outbox for the next start, or ``effects relay --db``), then
        close the file."""
        self._local.open = False  # from now on its claims are held by their leases alone
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        if self._relay is not None:
            await self._relay.stop(relay_timeout)
        if self._lookup is not None:
            await self._lookup.close()
        await self._store.close()

    @property
    def relay(self) -> Relay | None:
        return self._relay

    @property
    def store(self) -> Store:
        return self._store

    def now_ms(self) -> int:
        return self._clock()

    def register(self, target: Target) -> None:
        check_name("target", target.name)
        self._targets[target.name] = target

    def target(self, name: str) -> Target:
        """The declared target ``name``; ``UnknownTarget`` if it was not declared."""
        t = self._targets.get(name)
        if t is None:
            declared = ", ".join(sorted(self._targets)) or "none"
            raise UnknownTarget(
                f"target {name!r} is not declared (declared: {declared}); declare how to ask it in the "
                "targets file (Ledger.open(..., targets=...) or EFFECTS_TARGETS)"
            )
        return t

    @property
    def targets(self) -> dict[str, Target]:
        """The declared targets by name."""
        return dict(self._targets)

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
        derived from them, see ``effect_ledger.streams.keys.effect_key``) or your own ``key``."""
        if self._store.closed:
            raise LedgerClosed(f"ledger {self._store.path} is closed")
        check_name("target", target)
        check_name("operation", operation)
        self.target(target)  # undeclared: refused before anything is written
        ns = self._namespace if namespace is None else namespace
        check_ids(run_id, step, ns)  # recorded in the intent even when the key is given
        if key is None:
            if run_id is None or step is None:
                raise InvalidEffect("give run_id and step (the key is derived from them), or key")
            key = effect_key(target, operation, run_id, step, ns)
        else:
            check_key(key)
        canonical, request_digest = canonical_request(request)  # valid, within MAX_REQUEST_BYTES
        t_s = self._default_timeout if timeout is None else timeout
        if isinstance(t_s, bool) or not isinstance(t_s, int | float) or not 0 < t_s <= 7 * 24 * 3600:
            raise InvalidEffect(f"timeout must be a number of seconds > 0, got {t_s!r}")
        if not callable(call):
            raise InvalidEffect("call must be a function of the idempotency key")
        if key in self._inflight:
            raise EffectInProgress(key, "another task of this worker is executing it")
        self._inflight.add(key)
        try:
            spec = _Spec(target, operation, ns, run_id or "", step or "", canonical, request_digest, float(t_s))
            if self._lookup is None:
                # The common case is a key nobody has used: claim it with the intent straight away
                # (the write's version check fails if the key exists), which saves a read.
                try:
                    return await self._run_attempt(key, None, spec, call, None)
                except VersionConflict:
                    pass  # it exists: look at what is known and decide
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
        if self._lookup is not None and (loaded.effect is None or loaded.effect.state in OPEN_STATES):
            loaded = await self._merge_remote(key, loaded)
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
            # The claim of an earlier attempt: refuse while its worker lives, else take it over.
            observed_owner = self._check_claim(effect, loaded.claim)
            if effect.state in OPEN_STATES:
                effect = await self._resolve_earlier(effect, spec, call)
                if effect.state is State.CONFIRMED:
                    return _confirmation(effect, called=False)
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

    async def _merge_remote(self, key: str, loaded: Loaded) -> Loaded:
        """Import what the processor knows about the key (events other hosts wrote)."""
        assert self._lookup is not None
        decoded = self._remote_events(key, await self._lookup.events(key))
        if not decoded:
            return loaded
        before = loaded.effect
        for _ in range(_CONFLICT_RETRIES):
            try:
                await self._store.append(before, decoded, now_ms=self._clock(), sent=True)
                break
            except VersionConflict:
                before = (await self._store.load(key)).effect
        merged = await self._store.load(key)
        e = merged.effect
        if e is not None and merged.claim.owner is None and e.state in OPEN_STATES and e.intent is not None:
            # The attempt was made on another host: its intent names the worker, its deadline the lease.
            return Loaded(e, Claim(e.intent.worker, e.intent.deadline_ms))
        return merged

    def _remote_events(self, key: str, remote: list[bytes]) -> list[Event]:
        """The facts in a processor's answer. Only events of this key are ever copied into the
        file: a record that is not an event (a state or work item a processor table picked up
        before it refused them) is no fact and is left out; one that does not decode, or names
        another key, makes the answer one the SDK cannot vouch for."""
        out: list[Event] = []
        for body in remote:
            try:
                record = self._store.codec.decode(body)
            except DecodeError as e:
                raise LedgerUnavailable(f"the ledger processor answered an undecodable record for {key}: {e}") from e
            if not is_event(record):
                log.warning("lookup of %s: left out a %s record, which is not an event", key, type(record).__name__)
                continue
            if record.effect_id != key:
                raise LedgerUnavailable(f"the ledger processor answered an event of {record.effect_id!r} for {key!r}")
            out.append(record)
        return out

    def _check_claim(self, effect: Effect, claim: Claim) -> str | None:
        """Raise ``EffectInProgress`` while another live worker holds the key; otherwise return the
        owner to take the claim over from (None when nobody holds it)."""
        if claim.owner is None or claim.owner == self.worker:
            return claim.owner
        now = self._clock()
        alive = owner_alive(claim.owner, effect.effect_id)
        leased = claim.until_ms is not None and now < claim.until_ms
        if alive or (alive is None and leased):
            retry = max(0, claim.until_ms - now) if claim.until_ms else None
            raise EffectInProgress(
                effect.effect_id, f"worker {claim.owner} is executing attempt {effect.attempt}", retry
            )
        return claim.owner

    async def _resolve_earlier(self, effect: Effect, spec: _Spec, call: Call) -> Effect:
        """An earlier attempt is open and its worker gone. Returns the effect CONFIRMED or ABSENT, or
        raises."""
        due = expire(effect, self._clock())
        if due:  # record what is already true, so the answer below reports UNCERTAIN, not PENDING
            effect = await self._record(effect, list(due))
        target = self.target(spec.target)
        answer, name = await self._ask(effect, target, call, spec.timeout)
        effect, resolution = await self._record_answer(effect, target, answer, name)
        now = self._clock()
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
            except Exception as e:
                if target.rejects(e):
                    return Absent(f"replay rejected: {e}"), "replay"
                return Unknown(f"replay failed: {type(e).__name__}: {e}"), "replay"
            return Found(receipt_of(target, value)[0], value), "replay"
        return None, "none"

    async def reconcile(self, key: str, call: Call | None = None) -> Effect | None:
        """Ask once about an open effect (used by the runner); records and returns the outcome."""
        effect = (await self._store.load(key)).effect
        if effect is None or effect.state not in OPEN_STATES:
            return effect
        name = effect.intent.target if effect.intent else key.split(":", 1)[0]
        declared = self._targets.get(name)
        if declared is None:
            # Nobody was told how to ask this destination: an unknown answer, so the effect is
            # asked again after a backoff (time to fix the declaration) and then escalated.
            target = Target(name)
            unknown = Unknown(f"target {name!r} is not declared in this ledger's targets; nobody was asked")
            return (await self._record_answer(effect, target, unknown, "undeclared"))[0]
        answer, asked = await self._ask(effect, declared, call, self._default_timeout)
        return (await self._record_answer(effect, declared, answer, asked))[0]

    async def _record_answer(
        self, effect: Effect, target: Target, answer: Answer | None, name: str
    ) -> tuple[Effect, Resolution]:
        """Judge and record a reconciler's answer. When someone else recorded an answer meanwhile,
        judge again on what they wrote: resolution ids count tries, so re-applying the same event
        would be dropped as known, and a Found must never be lost to a concurrent Unknown."""
        for _ in range(_CONFLICT_RETRIES):
            resolution = judge(effect, target, answer, name, self._clock())
            try:
                after = await self._store.append(effect, [resolution], now_ms=self._clock())
                return after.effect, resolution
            except VersionConflict:
                reloaded = (await self._store.load(effect.effect_id)).effect
                assert reloaded is not None
                effect = reloaded
                if effect.state not in OPEN_STATES:
                    return effect, resolution  # settled meanwhile (by the other answer or a person)
        raise EffectInProgress(effect.effect_id, "could not record the reconciler's answer: the effect kept changing")

    async def _run_attempt(
        self, key: str, before: Effect | None, spec: _Spec, call: Call, observed_owner: str | None
    ) -> Confirmation:
        crashpoints.reached(crashpoints.BEFORE_INTENT)
        now = self._clock()
        attempt = before.attempt + 1 if before else 1
        deadline = now + int(spec.timeout * 1000)
        intent = Intent(
            event_id=new_event_id(),
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
        effect, _, intent_seq = await self._store.append(
            before,
            [intent],
            now_ms=now,
            claim_op=ClaimOp.TAKE,
            owner=self.worker,
            claim_until_ms=deadline,
            observed_owner=observed_owner,
        )
        if self._sync and self._relay is not None and intent_seq:
            acked = await self._relay.wait_acked(intent_seq, self._sync_timeout)
            refused = self._relay.refusal(intent_seq)
            if refused is not None or not acked:
                reason = (
                    f"intent refused by Kafka and dead-lettered ({refused}); destination not called"
                    if refused is not None
                    else f"intent not acknowledged by Kafka within {self._sync_timeout:g} s; destination not called"
                )
                await self._outcome(effect, attempt, Outcome.FAILED, reason, self._clock())
                raise LedgerUnavailable(reason)
            if self._lookup is not None:  # another host may have written this attempt too: ask who owns it
                effect = await claims.settle(
                    self._store, self._lookup, self._relay.offset_of(intent_seq), intent, effect,
                    self._remote_events, self._clock,
                )  # fmt: skip
                if effect.state is State.CONFIRMED:
                    return _confirmation(effect, called=False)
        crashpoints.reached(crashpoints.AFTER_INTENT)
        target = self.target(spec.target)
        started = self._clock()
        try:
            async with asyncio.timeout(spec.timeout):
                value = await _maybe_await(call(key))
        except BaseException as e:
            if target.rejects(e):
                await self._after_call(effect, attempt, Outcome.FAILED, f"{type(e).__name__}: {e}", started)
                raise
            # A timeout, a transport error, an unexpected exception, a cancelled task: the request
            # may or may not have reached the destination.
            what = "timed out" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            try:
                await asyncio.shield(self._after_call(effect, attempt, Outcome.UNKNOWN, what, started))
                state = State.UNCERTAIN.value
            except EffectUncertain as unrecorded:  # the store failed too: the intent stays PENDING
                if not isinstance(e, Exception):
                    raise e from unrecorded  # a cancellation stays a cancellation
                raise unrecorded  # its cause is the storage error; its context, the call's
            if isinstance(e, Exception):
                raise EffectUncertain(key, f"call outcome unknown ({bounded_text(what, 512)})", state) from e
            raise
        crashpoints.reached(crashpoints.AFTER_CALL)
        # The outcome and the receipt the call returned are one write: there is no moment at which
        # the ledger knows the call succeeded but has lost what it returned. Whatever the value, the
        # fact that the call returned is recorded (``receipt_of`` never raises).
        receipt_id, text, problem = receipt_of(target, value)
        receipt = Receipt(new_event_id(), key, self._clock(), attempt, receipt_id, ReceiptSource.CALL, text)
        effect = await self._after_call(effect, attempt, Outcome.OK, None, started, receipt)
        crashpoints.reached(crashpoints.AFTER_EXECUTED)
        # What the destination returned, as it returned it (a replay later gives the recorded JSON).
        exact = not text.startswith(INEXACT_PREFIX)
        confirmation = Confirmation(key, receipt_id, value, ReceiptSource.CALL, attempt, True, exact)
        if problem is not None:
            raise ReceiptNotRecordable(confirmation, problem)
        return confirmation

    async def _after_call(
        self, effect: Effect, attempt: int, outcome: Outcome, error: str | None, started: int,
        receipt: Receipt | None = None,
    ) -> Effect:
        """Record a call's outcome. The call has happened (or may have): when the ledger cannot
        record it (a full disk, a closed ledger), the caller gets ``EffectUncertain`` with the cause,
        never the bare storage error; the intent stays, for the runner to reconcile."""
        try:
            return await self._outcome(effect, attempt, outcome, error, started, receipt)
        except (StorageError, LedgerClosed) as e:
            raise EffectUncertain(
                effect.effect_id,
                f"the call ended ({outcome.value}) but its outcome could not be recorded: {e}; "
                "the intent stays open for reconciliation",
                State.PENDING.value,
            ) from e

    async def _outcome(
        self, effect: Effect, attempt: int, outcome: Outcome, error: str | None, started: int,
        receipt: Receipt | None = None,
    ) -> Effect:
        now = self._clock()
        if error is not None:
            error = bounded_text(error)  # an exception's message can be any size, and any string
        ev = Executed(new_event_id(), effect.effect_id, now, attempt, outcome, error, started, now, None, self.worker)
        events: list[Event] = [ev] if receipt is None else [ev, receipt]
        return await self._record(effect, events, claim_op=ClaimOp.RELEASE)

    async def _record(self, before: Effect | None, events: list[Event], claim_op: ClaimOp = ClaimOp.KEEP) -> Effect:
        """Write events that must land whatever else happened to the effect meanwhile (a runner's
        timeout, a webhook's receipt): on a version conflict, reload and fold again."""
        for _ in range(_CONFLICT_RETRIES):
            try:
                return (await self._store.append(before, events, now_ms=self._clock(), claim_op=claim_op)).effect
            except VersionConflict:
                before = (await self._store.load(events[0].effect_id)).effect
        raise EffectInProgress(events[0].effect_id, "could not record: the effect kept changing")

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
        source: ReceiptSource | str = ReceiptSource.WEBHOOK,
        attempt: int = 0,
        allow_unknown: bool = False,
    ) -> Effect:
        """Record a receipt that arrives after the call (a webhook). ``attempt`` 0: unknown.

        The key must be one this ledger knows (after a lookup, in Kafka mode with ``lookup``):
        ``UnknownEffect`` otherwise, so a mistyped key never creates a CONFIRMED effect nobody
        executed. ``allow_unknown=True`` records it anyway, flagged NO_INTENT, for a receipt that can
        legitimately come first (the effect was executed by another host whose events have not
        arrived). ``value`` is recorded like a call's (``limits.receipt_text``): never refused,
        flagged INEXACT_RECEIPT when it is not JSON or over the size limit."""
        check_key(key)
        check_text("receipt_id", receipt_id, MAX_RECEIPT_ID_BYTES)
        kind = _enum(ReceiptSource, "source", source)
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise InvalidEffect(f"invalid attempt {show(attempt)}: an integer >= 0 (0: unknown)")
        loaded = await self._store.load(key)
        if loaded.effect is None and self._lookup is not None:
            loaded = await self._merge_remote(key, loaded)
        if loaded.effect is None and not allow_unknown:
            raise UnknownEffect(key, str(self._store.path))
        ev = Receipt(new_event_id(), key, self._clock(), attempt, receipt_id, kind, receipt_text(value)[0])
        return await self._record(loaded.effect, [ev])

    async def decide(
        self, key: str, decision: DecisionKind | str, *, by: str, reason: str, receipt_id: str | None = None
    ) -> Effect:
        """Record a person's decision on an effect (usually an escalated one). ``by`` and ``reason``
        are required, at most ``limits.MAX_TEXT_BYTES`` each; an unknown key is ``UnknownEffect``.
        ``DecisionRefused`` for ABSENT while the attempt may still land at the destination (see
        ``effect_ledger.streams.effect.decision_refusal``). The decision carries ``by`` and the
        identity this process writes as (``operator_identity``); in Kafka mode the relay sends it
        to ``effects.decisions``."""
        check_key(key)
        kind = _enum(DecisionKind, "decision", decision)
        if not isinstance(by, str) or not by or not isinstance(reason, str) or not reason:
            raise InvalidEffect("a decision needs who made it (by) and why (reason), as non-empty strings")
        check_text("by", by)
        check_text("reason", reason)
        if receipt_id is not None:
            check_text("receipt_id", receipt_id, MAX_RECEIPT_ID_BYTES)
        loaded = await self._store.load(key)
        if self._lookup is not None:
            loaded = await self._merge_remote(key, loaded)  # decide on everything known, not this file only
        before = loaded.effect
        if before is None:
            raise UnknownEffect(key, str(self._store.path))
        now = self._clock()
        refused = decision_refusal(before, kind, now)
        if refused is not None:
            raise DecisionRefused(key, refused.reason, refused.retry_after_ms)
        principal = operator_identity(self._relay.cfg if self._relay is not None else None)
        ev = Decision(new_event_id(), key, now, before.attempt, kind, by, reason, receipt_id, principal)
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
            op, sig = self.check_wrapped(fn, operation, key_arg)

            @functools.wraps(fn)
            async def wrapper(
                *args: Any, run_id: str | None = None, step: str | None = None, key: str | None = None, **kwargs: Any
            ) -> Any:
                confirmation = await self.execute(
                    target=target,
                    operation=op,
                    request=bind_request(sig, key_arg, args, kwargs),
                    run_id=run_id,
                    step=step,
                    key=key,
                    timeout=timeout,
                    call=lambda k: fn(*args, **{**kwargs, key_arg: k}),
                )
                return confirmation.value

            return wrapper

        return wrap

    @staticmethod
    def check_wrapped(fn: Callable[..., Any], operation: str | None, key_arg: str) -> tuple[str, inspect.Signature]:
        """The operation name and signature of a function the decorator wraps (it must take the key)."""
        op = operation or fn.__name__.replace("_", ".")
        check_name("operation", op)
        sig = inspect.signature(fn)
        if key_arg not in sig.parameters:
            raise InvalidEffect(f"{fn.__name__} must accept the idempotency key as keyword {key_arg!r}")
        return op, sig


def bind_request(sig: inspect.Signature, key_arg: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request of a decorated call: its arguments by name, defaults applied, without the key."""
    bound = sig.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k != key_arg}


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


E = TypeVar("E", ReceiptSource, DecisionKind)


def _enum(cls: type[E], kind: str, value: object) -> E:
    try:
        return cls(value)  # type: ignore[arg-type]  # anything a caller passes; a bad one is refused below
    except ValueError:
        names = ", ".join(m.value for m in cls)
        raise InvalidEffect(f"invalid {kind} {show(value)}: one of {names}") from None


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


__all__ = ["Ledger", "Confirmation", "bind_request"]
