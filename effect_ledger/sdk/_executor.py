"""Carrying out the per-call plan (``effect_ledger.core.plan``): the durable writes, the ask, the
call.

``Executor.execute`` gathers what is known about a key (the file; in Kafka mode with a lookup, the
processor's events too; the claim's owner and whether it lives), asks ``plan`` what to do, and does
it. An attempt, in the order of its durable writes:

1. the intent, claiming the key in the same statement (``Store.append`` with ``ClaimOp.TAKE``);
2. Kafka mode with ``sync``: the broker's acknowledgement of the intent, else FAILED, no call;
3. the claim's confirmation across hosts (``_confirm_claim``; nothing to wait for today);
4. the call, under the deadline recorded in the intent;
5. its outcome and the receipt it returned, in one write that releases the claim.

Any write may find that someone else wrote the effect since it was loaded (``VersionConflict``):
the executor then loads again and plans again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from effect_ledger.core.deadlines import call_deadline_ms
from effect_ledger.core.effect import Effect, attempt_deadline, expire
from effect_ledger.core.limits import bounded_text
from effect_ledger.core.model import (
    INEXACT_PREFIX,
    OPEN_STATES,
    Event,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
)
from effect_ledger.core.plan import (
    CONFLICT_RETRIES,
    AskFirst,
    CallSpec,
    Execute,
    Known,
    Plan,
    Refuse,
    ReturnReceipt,
    after_answer,
    plan,
)
from effect_ledger.core.reconcile import Answer, Target, answered_too_early, judge, target_for, target_name, view
from effect_ledger.errors import (
    EffectInProgress,
    EffectRetired,
    EffectUncertain,
    LedgerClosed,
    LedgerUnavailable,
    NotAuthorized,
    ReceiptNotRecordable,
    StorageError,
    UnknownTarget,
)
from effect_ledger.metrics import tracing
from effect_ledger.sdk import bodies, crashpoints
from effect_ledger.sdk._workers import LocalWorker, owner_alive
from effect_ledger.sdk.erasure import Keyring
from effect_ledger.sdk.kafka import claims
from effect_ledger.sdk.kafka.remote import merge_remote, remote_events
from effect_ledger.sdk.receipts import Confirmation, confirmation_of, new_event_id, receipt_of
from effect_ledger.sdk.store import retire as retire_store
from effect_ledger.sdk.store.sqlite import ClaimOp, Loaded, Store, VersionConflict
from effect_ledger.streams.config import operator_identity
from effect_ledger.targets.ask import ask

if TYPE_CHECKING:
    from effect_ledger.sdk.kafka.lookup import ProcessorLookup
    from effect_ledger.sdk.kafka.relay import Relay

Call = Callable[[str], Any]

#: In Kafka mode with ``sync``: the least share of its timeout a call is started with (``_call``).
_LEAST_CALL_SHARE = 0.25
#: ``execute``'s pauses between tries of a refusal that passes (``_Passing``), doubling (seconds).
_AGAIN_FIRST_S = 0.1
_AGAIN_MOST_S = 2.0
#: The most attempts one ``execute`` writes that are then refused for a cause that passes (the
#: broker's or the processor's confirmations came too late for the call). Each is an intent and a
#: FAILED outcome that the processor must fold: tried again for the whole ``sync_timeout``, a
#: processor that was late got several times the events of its load and stayed late after the fault
#: that made it so had passed (``make chaos``: calls failed for minutes, whatever the fault).
MOST_REFUSED_ATTEMPTS = 3


class TimedCall(ABC):
    """A call that keeps its own time: ``within(key, left_s)`` waits for it, blocking the thread,
    and raises ``TimeoutError`` past ``left_s``, what is left of the intent's timeout; ``call(key)``
    returns an awaitable, for the other uses (a replay). ``SyncLedger`` gives one when it runs the
    ledger's work on the caller's thread, on a loop where nothing else runs: waiting for a thread
    there costs less than waking a loop."""

    @abstractmethod
    def __call__(self, key: str) -> Any: ...

    @abstractmethod
    def within(self, key: str, left_s: float) -> Any: ...


class _Passing(Exception):
    """Refused before any call of this caller, nothing left open, for a cause that passes by itself:
    ``execute`` plans and tries again while its ``sync_timeout`` lasts, else raises ``error``.
    ``attempted``: an attempt was written (and is now FAILED, nothing sent); ``execute`` makes at
    most ``MOST_REFUSED_ATTEMPTS`` of those."""

    def __init__(self, error: LedgerUnavailable, *, attempted: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.attempted = attempted


def not_acknowledged(waited_s: float, sync_timeout: float) -> str:
    """Why an attempt whose intent Kafka did not acknowledge in time was not called. Its wait is
    what was left of ``sync_timeout`` when it began: earlier attempts of the same ``execute``,
    refused for a cause that passes, may have taken the rest, and then the message says so."""
    if waited_s < sync_timeout - 1.0:
        return (
            f"intent not acknowledged by Kafka in the {waited_s:.1f} s left of the {sync_timeout:g} s sync_timeout "
            "(earlier attempts of this call were refused and took the rest); destination not called"
        )
    return f"intent not acknowledged by Kafka within {sync_timeout:g} s; destination not called"


class Executor:
    """Carries out plans for one ledger: it owns the writes of an execution and of a reconciler's
    answer. ``targets`` is the ledger's own mapping (registering a target shows here too);
    ``sync_timeout`` is None unless intents wait for the broker (Kafka mode with ``sync``)."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], int],
        targets: MutableMapping[str, Target],
        *,
        relay: Relay | None = None,
        lookup: ProcessorLookup | None = None,
        sync_timeout: float | None = None,
        confirm_within: float = 0.0,
        keyring: Keyring | None = None,
    ) -> None:
        self.store = store
        self.keyring = keyring  # opens sealed request bodies for reconcilers (None: nothing sealed)
        # This ledger's clock: the times its events claim, and what its plan compares with its file's
        # facts (their writers' claims). In Kafka mode what it writes counts only as the log decides:
        # the processor folds on the broker's time, and its claim verdict says when a new attempt may
        # call (``core.effect.claim_verdict``), whatever this clock says.
        self.clock = clock
        self.targets = targets
        self.relay = relay
        self.lookup = lookup
        self.sync_timeout = sync_timeout
        # What an attempt's deadline adds to its call's timeout for the broker's acknowledgement and
        # the processor's verdict: only when the call waits for them (``sync``).
        self.confirm_within = confirm_within if sync_timeout is not None else 0.0
        # Who this ledger object is to claims, and the keys it is executing: another ledger of this
        # process treats its claims as live only while it is open and has the key in flight.
        self.local = LocalWorker()
        # Claims confirmed across hosts before a call (effect_ledger/sdk/kafka/claims.py): agents on several hosts
        # may race for a key only in Kafka mode, and only a processor's lookup can arbitrate; the
        # verdict is asked for once the broker has acknowledged the intent (``sync``).
        self.confirm_claims = relay is not None and lookup is not None and sync_timeout is not None
        # key -> when its execute stops waiting for the broker and the processor (time.monotonic()):
        # ``sync_timeout`` after it began, whatever attempts it took (one execute per key at a time).
        self._give_up: dict[str, float] = {}

    @property
    def worker(self) -> str:
        return self.local.identity

    def target(self, name: str) -> Target:
        """The declared target ``name``; ``UnknownTarget`` if it was not declared."""
        t = self.targets.get(name)
        if t is None:
            declared = ", ".join(sorted(self.targets)) or "none"
            raise UnknownTarget(
                f"target {name!r} is not declared (declared: {declared}); declare how to ask it in the "
                "targets file (Ledger.open(..., targets=...) or EFFECTS_TARGETS)"
            )
        return t

    # -- what is known -----------------------------------------------------------------------

    async def load(self, key: str, *, remote: bool = False) -> Loaded:
        """What is known about the key: the file; with a lookup, the processor's events merged in
        when the file knows nothing, knows it only as open, or ``remote`` asks for it."""
        loaded = await self.store.load(key)
        if self.lookup is not None and (remote or loaded.effect is None or loaded.effect.state in OPEN_STATES):
            loaded = await merge_remote(self.store, self.lookup, key, loaded, self.clock)
        return loaded

    def known(self, key: str, loaded: Loaded) -> Known:
        """The plan's input: ``loaded``, the time, this worker, and whether the claim's owner lives."""
        owner = loaded.claim.owner
        alive = owner_alive(owner, key) if owner is not None and owner != self.worker else None
        return Known(loaded.effect, owner, loaded.claim.until_ms, self.clock(), self.worker, alive, self.confirm_claims)

    # -- execute -----------------------------------------------------------------------------

    async def execute(self, key: str, spec: CallSpec, call: Call) -> Confirmation:
        """Plan and carry out one ``execute`` of a checked call (see the module docstring)."""
        if not self.local.enter(key):
            raise EffectInProgress(key, "another task of this worker is executing it")
        try:
            # Kafka mode with ``sync``: a refusal before any call of this caller whose cause passes by
            # itself (a leader election, the processor catching up) is tried again, as the caller
            # would, until ``sync_timeout`` s after the start; then it is raised.
            give_up = time.monotonic() + self.sync_timeout if self.sync_timeout is not None else None
            if give_up is not None:
                self._give_up[key] = give_up  # what the waits for the broker and the processor may take
            pause = _AGAIN_FIRST_S
            refused = 0  # attempts written, then refused
            while True:
                try:
                    return await self._execute_planned(key, spec, call)
                except _Passing as p:
                    refused += p.attempted
                    if refused >= MOST_REFUSED_ATTEMPTS:
                        raise LedgerUnavailable(
                            f"{p.error} ({refused} attempts of this execute were refused so; the broker or the "
                            "processor is behind: try again later)",
                            passing=True,
                        ) from p.error.__cause__
                    if give_up is None or time.monotonic() + pause >= give_up:
                        raise p.error from p.error.__cause__
                    # Jittered: the callers a failover held back do not all ask again at once.
                    await asyncio.sleep(pause * random.uniform(0.5, 1.5))
                    pause = min(pause * 2, _AGAIN_MOST_S)
        finally:
            self.local.leave(key)
            self._give_up.pop(key, None)

    async def _execute_planned(self, key: str, spec: CallSpec, call: Call) -> Confirmation:
        if self.lookup is None:
            # The common case is a key nobody has used: plan on "nothing known" and claim it with
            # the intent straight away (the write's version check fails if the key exists),
            # which saves a read.
            try:
                return await self._attempt(key, None, spec, call, Execute(1, None, self.confirm_claims))
            except VersionConflict:
                pass  # it exists: look at what is known and decide
        for _ in range(CONFLICT_RETRIES):
            try:
                return await self._execute_once(key, spec, call)
            except VersionConflict:
                continue
        raise EffectInProgress(key, "the effect kept changing under this worker; try again")

    async def settle(self, key: str, spec: CallSpec, call: Call) -> Effect | None:
        """``execute``'s first step alone: an open earlier attempt whose worker is gone is asked
        about and the answer recorded; nothing is executed. Returns the effect as it then stands."""
        loaded = await self.load(key)
        if key in self.local.in_flight:  # this worker is executing it: nothing to ask yet
            return loaded.effect
        step = plan(self.known(key, loaded), spec)
        if isinstance(step, AskFirst):
            return (await self._ask_first(step, spec, call))[0]
        return loaded.effect

    async def _execute_once(self, key: str, spec: CallSpec, call: Call) -> Confirmation:
        try:
            loaded = await self.load(key)
        except LedgerUnavailable as e:
            if e.passing:  # nothing was written: asking again is what the caller would do
                raise _Passing(e) from e
            raise
        effect = loaded.effect
        if effect is None:
            await self.refuse_retired(key)
        step = plan(self.known(key, loaded), spec)
        if isinstance(step, AskFirst):
            effect, step = await self._ask_first(step, spec, call)
        return await self._carry_out(key, step, effect, spec, call)

    async def _carry_out(self, key: str, step: Plan, before: Effect | None, spec: CallSpec, call: Call) -> Confirmation:
        if isinstance(step, ReturnReceipt):
            return confirmation_of(step.effect, called=False)
        if isinstance(step, Refuse):
            raise step.error
        if isinstance(step, Execute):
            return await self._attempt(key, before, spec, call, step)
        raise AssertionError(f"a plan asked again: {step!r}")  # after_answer never returns AskFirst

    async def _ask_first(self, asked: AskFirst, spec: CallSpec, call: Call) -> tuple[Effect, Plan]:
        """Ask the destination about the open earlier attempt (its worker is gone), record the
        answer, and plan again on it."""
        effect = asked.effect
        due = expire(effect, self.clock())
        if due:  # record what is already true, so the answer below reports UNCERTAIN, not PENDING
            effect = await self.record(effect, list(due))
        target = self.target(spec.target)
        asked_at = self.clock()
        answer, name = await self.ask(effect, target, call, spec.timeout)
        effect, resolution = await self.record_answer(effect, target, answer, name, asked_at)
        # Asking again can change an unknown answer once the old call has stopped (its deadline),
        # and an "absent" given too early once the call can no longer land.
        deadline = attempt_deadline(effect, effect.attempt) or 0
        until = target.may_still_land_until_ms(deadline) if answered_too_early(resolution) else deadline
        return effect, after_answer(asked, effect, resolution, self.clock(), self.confirm_claims, until)

    async def refuse_retired(self, key: str) -> None:
        """``EffectRetired`` for a retired key: only such a key has no events yet cannot be
        created (retire_store's trigger ignores the insert, which reads as a version conflict)."""
        marker = await retire_store.retired(self.store, key)
        if marker is not None:
            raise EffectRetired(key, marker.state, marker.retired_ms)

    async def ask(
        self, effect: Effect, target: Target, call: Call | None, call_timeout: float, *, declared: bool = True
    ) -> tuple[Answer | None, str]:
        """``targets.ask.ask`` with this ledger's call: a target that honours keys and has no
        reconciler is asked by replaying the call with the same key, under the call's timeout."""
        replay = None
        if call is not None:

            async def replay() -> Any:
                async with asyncio.timeout(call_timeout):
                    return await maybe_await(call(effect.effect_id))

        shown = view(effect)
        if effect.intent is not None and self.keyring is not None:  # a sealed body is opened, if it can be
            req = await bodies.readable_request(
                self.keyring, effect.effect_id, effect.intent.request, effect.intent.request_digest
            )
            shown = dataclasses.replace(shown, request=req)
        return await ask(
            shown, target, self.clock(), declared=declared, replay=replay,
            receipt_of=lambda value: receipt_of(target, value)[0],
        )  # fmt: skip

    async def reconcile(self, key: str, call: Call | None, call_timeout: float) -> Effect | None:
        """Ask once about an open effect (the runner's step); records and returns the outcome."""
        effect = (await self.store.load(key)).effect
        if effect is None or effect.state not in OPEN_STATES:
            return effect
        target, declared = target_for(self.targets, target_name(effect))
        intent = effect.intent
        with tracing.effect_span(
            "reconcile", key, target.name, intent.operation if intent else "", effect.attempt
        ) as span:
            asked_at = self.clock()
            answer, asked = await self.ask(effect, target, call, call_timeout, declared=declared)
            after = (await self.record_answer(effect, target, answer, asked, asked_at))[0]
            if span is not None:
                span.end_state(after.state.value)
            return after

    async def _attempt(
        self, key: str, before: Effect | None, spec: CallSpec, call: Call, step: Execute
    ) -> Confirmation:
        crashpoints.reached(crashpoints.BEFORE_INTENT)
        await self._refuse_if_forbidden()
        now = self.clock()
        # The deadline counts from the intent, on this process's monotonic clock: the confirmations'
        # allowance (``confirm_within``) and the call's timeout; the call gets its timeout, or what
        # is left of the deadline once the broker and the processor have answered (``_call``).
        written = time.monotonic()
        attempt = step.attempt
        deadline = call_deadline_ms(now, spec.timeout + self.confirm_within)
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
            request=spec.recorded,
            request_digest=spec.digest,
            deadline_ms=deadline,
            worker=self.worker,
            lands_within_ms=self.target(spec.target).lands_within_ms,
        )
        # The claim lives until the deadline: past it, the call cannot still be running here.
        effect, intent_seq = await self.store.append(
            before,
            [intent],
            now_ms=now,
            claim_op=ClaimOp.TAKE,
            owner=self.worker,
            claim_until_ms=deadline,
            observed_owner=step.take_over_from,
        )
        # The attempt exists from here on (its intent is durable): its span, when the application
        # records them (``effect_ledger.metrics.tracing``), ends with the effect's state after it.
        with tracing.effect_span(
            "attempt", key, spec.target, spec.operation, attempt, run_id=spec.run_id, step=spec.step
        ) as span:
            try:
                confirmation = await self._after_intent(key, effect, intent, intent_seq, step, spec, call, written)
            except BaseException as e:
                if span is not None:
                    # The state the ledger holds now, not one guessed from the exception: a rejection
                    # is FAILED, an unknown outcome UNCERTAIN, an unrecordable one still PENDING.
                    try:
                        after = (await self.store.load(key)).effect
                    except Exception:  # the store failed too: the exception says what happened
                        after = None
                    span.end_state(after.state.value if after is not None else "UNRECORDED", e)
                raise
            if span is not None:
                span.end_state(State.CONFIRMED.value)
            return confirmation

    async def _after_intent(
        self, key: str, effect: Effect, intent: Intent, intent_seq: int | None, step: Execute, spec: CallSpec,
        call: Call, written: float,
    ) -> Confirmation:  # fmt: skip
        attempt = intent.attempt
        await self._wait_acked(effect, attempt, intent_seq, self._give_up.get(key))
        took = {"the broker": time.monotonic() - written} if self.sync_timeout is not None and intent_seq else {}
        if step.confirm_claim:
            effect = await self._confirm_claim(intent, effect, intent_seq, written)
            took["the processor"] = time.monotonic() - written
            if effect.state is State.CONFIRMED:  # another host's attempt won, and has its receipt
                return confirmation_of(effect, called=False)
        crashpoints.reached(crashpoints.AFTER_INTENT)
        left = min(spec.timeout, spec.timeout + self.confirm_within - (time.monotonic() - written))
        return await self._call(key, effect, attempt, spec, call, left, took)

    async def _refuse_if_forbidden(self) -> None:
        """Kafka's ACLs refused this principal a write to the events topic (the relay met it): an
        intent recorded now could never reach Kafka, so none is, and nothing is called. The
        broker is asked again each time (the ACLs may have been fixed since)."""
        refused = self.relay.forbidden.get(self.relay.topic) if self.relay is not None else None
        if self.relay is None or refused is None:
            return
        from effect_ledger.streams import rights

        cfg = self.relay.cfg
        try:
            missing = await asyncio.to_thread(rights.missing_rights, cfg, "agent", 5.0)
        except Exception:  # no answer: the last refusal stands
            missing = [refused]
        if missing:
            raise NotAuthorized("execute", operator_identity(cfg), missing)
        self.relay.forbidden.pop(self.relay.topic, None)

    async def _wait_acked(self, effect: Effect, attempt: int, intent_seq: int | None, give_up: float | None) -> None:
        """Kafka mode with ``sync``: the destination is called only once the broker holds the intent;
        otherwise the attempt is FAILED (nothing was sent) and ``LedgerUnavailable`` raised."""
        if self.sync_timeout is None or self.relay is None or not intent_seq:
            return
        wait = self.sync_timeout if give_up is None else max(0.0, give_up - time.monotonic())
        acked = await self.relay.wait_acked(intent_seq, wait)
        refused = self.relay.refusal(intent_seq)
        if refused is None and acked:
            return
        reason = (
            f"intent refused by Kafka and dead-lettered ({refused}); destination not called"
            if refused is not None
            else not_acknowledged(wait, self.sync_timeout)
        )
        await self._outcome(effect, attempt, Outcome.FAILED, reason, self.clock())
        right = self.relay.forbidden.get(self.relay.topic)
        if right is not None:  # an ACL refusal is its own error: waiting will not help
            raise NotAuthorized("execute", operator_identity(self.relay.cfg), [right])
        raise LedgerUnavailable(reason)

    async def _confirm_claim(self, intent: Intent, effect: Effect, intent_seq: int | None, written: float) -> Effect:
        """Kafka mode with ``sync`` and a lookup, where agents on several hosts may race for a key:
        wait for the processor's verdict on this intent (``claims.settle``: it has folded the key's
        partition through the intent's offset and says which intent owns the attempt), before the
        destination is called. Returns the effect when the claim is this intent's, or CONFIRMED
        with the winner's receipt; raises ``EffectInProgress`` for a lost claim (released, no call)
        and ``LedgerUnavailable`` when nobody answered (no call; the attempt is left to its deadline).
        The processor is asked again while it cannot answer yet, for ``sync_timeout`` s from the
        intent: a verdict that comes after the call's time has gone still settles the attempt (it
        is then FAILED, nothing sent, and the next attempt may claim the key)."""
        if self.lookup is None or self.relay is None or not intent_seq:
            return effect
        until = self._give_up.get(intent.effect_id, written + (self.sync_timeout or 0.0))
        return await claims.settle(
            self.store, self.lookup, self.relay.offset_of(intent_seq), intent, effect,
            lambda key, answer: remote_events(self.store, key, answer), self.clock, until,
        )  # fmt: skip

    async def _call(
        self, key: str, effect: Effect, attempt: int, spec: CallSpec, call: Call, left_s: float,
        took: dict[str, float] | None = None,
    ) -> Confirmation:  # fmt: skip
        """Call the destination for at most ``left_s``: its timeout, or what is left of the intent's
        deadline (the timeout after ``confirm_within`` for the confirmations) if less. Every
        other writer counts the attempt's deadline from the intent, so a call that started later
        with the whole timeout could land after they were told it no longer can. Nothing left: no
        call; the attempt is FAILED (nothing was sent) and ``LedgerUnavailable`` raised.

        In Kafka mode with ``sync`` the same holds for less than ``_LEAST_CALL_SHARE`` of the
        timeout left (the broker and the processor took the rest): such a call would most likely
        time out with the request perhaps landed (UNCERTAIN, for the reconcilers or a person),
        where no call is a clean new attempt, which ``execute`` makes with a whole timeout of its
        own while its ``sync_timeout`` lasts."""
        target = self.target(spec.target)
        least = spec.timeout * _LEAST_CALL_SHARE if self.sync_timeout is not None else 0.0
        if left_s <= 0 or left_s < least:
            when = ", ".join(f"{who} after {s:.1f} s" for who, s in (took or {}).items())
            allowed = f"{spec.timeout:g} s timeout" + (
                f" (after {self.confirm_within:g} s for the confirmations)" if self.confirm_within else ""
            )
            what = (
                f"the intent's deadline, its {allowed}, passed"
                if left_s <= 0
                else f"only {left_s:.2f} s of the intent's {allowed} was left"
            )
            reason = (
                f"not called: {what} while the broker and the processor confirmed it ({when or 'no answer in time'})"
            )
            await self._outcome(effect, attempt, Outcome.FAILED, reason, self.clock())
            # FAILED with nothing sent: the next attempt may claim the key at once (``execute``
            # tries it while its budget lasts).
            raise _Passing(LedgerUnavailable(f"{reason}; execute again", passing=True), attempted=True)
        started = self.clock()
        try:
            if isinstance(call, TimedCall):
                value = call.within(key, left_s)  # keeps its own time (no timer on a loop it blocks)
            else:
                async with asyncio.timeout(left_s):
                    value = await maybe_await(call(key))
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
        receipt = Receipt(new_event_id(), key, self.clock(), attempt, receipt_id, ReceiptSource.CALL, text)
        await self._after_call(effect, attempt, Outcome.OK, None, started, receipt)
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
    ) -> Effect:  # fmt: skip
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
    ) -> Effect:  # fmt: skip
        now = self.clock()
        if error is not None:
            error = bounded_text(error)  # an exception's message can be any size, and any string
        ev = Executed(new_event_id(), effect.effect_id, now, attempt, outcome, error, started, now, None, self.worker)
        events: list[Event] = [ev] if receipt is None else [ev, receipt]
        return await self.record(effect, events, claim_op=ClaimOp.RELEASE)

    # -- writes that must land ---------------------------------------------------------------

    async def record(self, before: Effect | None, events: list[Event], claim_op: ClaimOp = ClaimOp.KEEP) -> Effect:
        """Write events that must land whatever else happened to the effect meanwhile (a runner's
        timeout, a webhook's receipt): on a version conflict, reload and fold again."""
        for _ in range(CONFLICT_RETRIES):
            try:
                return (await self.store.append(before, events, now_ms=self.clock(), claim_op=claim_op)).effect
            except VersionConflict:
                before = (await self.store.load(events[0].effect_id)).effect
        raise EffectInProgress(events[0].effect_id, "could not record: the effect kept changing")

    async def record_answer(
        self, effect: Effect, target: Target, answer: Answer | None, name: str, asked_at: int
    ) -> tuple[Effect, Resolution]:
        """Judge and record a reconciler's answer, at the log's time the destination was asked
        (``asked_at``: an "absent" is what it said then). When someone else recorded an answer
        meanwhile, judge again on what they wrote: resolution ids count tries, so re-applying the same
        event would be dropped as known, and a Found must never be lost to a concurrent Unknown."""
        for _ in range(CONFLICT_RETRIES):
            resolution = judge(effect, target, answer, name, asked_at)
            try:
                after = await self.store.append(effect, [resolution], now_ms=self.clock())
                return after.effect, resolution
            except VersionConflict:
                reloaded = (await self.store.load(effect.effect_id)).effect
                assert reloaded is not None
                effect = reloaded
                if effect.state not in OPEN_STATES:
                    return effect, resolution  # settled meanwhile (by the other answer or a person)
        raise EffectInProgress(effect.effect_id, "could not record the reconciler's answer: the effect kept changing")


async def maybe_await(value: Any | Awaitable[Any]) -> Any:
    """``value``, awaited when it is awaitable (a call may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


__all__ = ["Call", "Executor", "TimedCall", "maybe_await"]
