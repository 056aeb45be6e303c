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

The decision is ``effect_ledger.core.plan.plan`` (pure, tested row by row); carrying it out is
``effect_ledger.sdk._executor.Executor``. This module checks inputs, opens and closes, and
records the facts that come later (webhook receipts, deadlines, people's decisions).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from effect_ledger._extras import require
from effect_ledger.core.effect import Effect, decision_refusal, expire
from effect_ledger.core.keys import (
    DEFAULT_NAMESPACE,
    canonical_request,
    check_ids,
    check_key,
    check_name,
    checked_effect_key,
)
from effect_ledger.core.limits import MAX_RECEIPT_ID_BYTES, check_text, receipt_text, show
from effect_ledger.core.model import Decision, DecisionKind, Receipt, ReceiptSource
from effect_ledger.core.plan import CallSpec
from effect_ledger.core.reconcile import Target, target_for, target_name
from effect_ledger.errors import (
    ConfigError,
    DecisionRefused,
    InvalidEffect,
    LedgerClosed,
    TargetsError,
    UnknownEffect,
)
from effect_ledger.sdk import bodies
from effect_ledger.sdk._executor import Call, Executor
from effect_ledger.sdk._wrap import keyed
from effect_ledger.sdk.erasure import FileKeyring, Keyring
from effect_ledger.sdk.kafka import claims
from effect_ledger.sdk.kafka.remote import merge_remote
from effect_ledger.sdk.receipts import Confirmation, new_event_id, wall_clock_ms
from effect_ledger.sdk.store.sqlite import Durability, Store
from effect_ledger.streams.config import KafkaConfig, operator_identity
from effect_ledger.targets.load import TargetsSpec
from effect_ledger.targets.load import resolve as resolve_targets

if TYPE_CHECKING:
    from effect_ledger.sdk.kafka.lookup import ProcessorLookup
    from effect_ledger.sdk.kafka.relay import Relay

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: A call's timeout when ``execute`` is given none (seconds): the deadline recorded in its intent.
DEFAULT_TIMEOUT_S = 10.0
#: How long ``execute`` waits in Kafka mode with ``sync`` for the broker's acknowledgement and the
#: processor's answers, trying again what passes by itself (seconds): a broker failover (the
#: cluster fences a silent broker after ``broker.session.timeout.ms``, 9 s by default, then the
#: client's request to it times out) fits in it.
DEFAULT_SYNC_TIMEOUT_S = 30.0
#: In Kafka mode with ``sync``: how long an attempt may wait for the broker's acknowledgement and
#: the processor's verdict before its call, on top of the call's timeout (seconds). The intent's
#: deadline is its timeout plus this, so a call confirmed late still gets its whole timeout: a
#: broker that dies stops every ``acks=all`` write for ``broker.session.timeout.ms`` (4 s on the
#: cluster ``make chaos`` runs, 9 s by Kafka's default) and the processor's writes with them, and
#: an attempt whose confirmation came in that window used to be refused, written again and folded
#: again (``make chaos``: 3-60 % of calls completed while a broker was down). The cost: an agent that
#: dies right after its intent leaves an effect that becomes UNCERTAIN this much later.
DEFAULT_CONFIRM_WITHIN_S = 10.0
#: The most ``confirm_within`` may be (seconds).
MAX_CONFIRM_WITHIN_S = 600.0
MAX_TIMEOUT_S = 7 * 24 * 3600


class Ledger:
    """An effect ledger on one SQLite file (embedded mode). Safe to share between tasks of one event
    loop; several processes may open the same file. Open it with ``Ledger.open``."""

    def __init__(
        self,
        store: Store,
        *,
        targets: Iterable[Target] = (),
        clock: Callable[[], int] = wall_clock_ms,
        default_timeout: float = DEFAULT_TIMEOUT_S,
        namespace: str = DEFAULT_NAMESPACE,
        relay: Relay | None = None,
        lookup: ProcessorLookup | None = None,
        sync_timeout: float | None = None,
        confirm_within: float = 0.0,
        metrics_server: Any = None,
        keyring: Keyring | None = None,
    ) -> None:
        """A ledger on an open ``store``. ``sync_timeout`` None: intents do not wait for the broker;
        ``confirm_within``: see ``open`` (used only with ``sync_timeout``);
        ``metrics_server`` is shut down by ``close``; ``keyring`` holds the keys of encrypted request
        bodies (default: the file's; in Kafka mode ``open`` gives the effects.keys topic's, so that
        one ``effects erase`` reaches every host)."""
        self._store = store
        self._clock = clock
        self._default_timeout = default_timeout
        self._namespace = namespace
        self._targets: dict[str, Target] = {}
        self._relay = relay
        self._lookup = lookup
        self._metrics_server = metrics_server
        self.keyring: Keyring = keyring if keyring is not None else FileKeyring(store)
        self._executor = Executor(
            store, clock, self._targets, relay=relay, lookup=lookup, sync_timeout=sync_timeout,
            confirm_within=confirm_within, keyring=self.keyring,
        )  # fmt: skip
        self.worker = self._executor.worker
        for t in targets:
            self.register(t)

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        durability: Durability | str = Durability.NORMAL,
        targets: TargetsSpec = None,
        clock: Callable[[], int] = wall_clock_ms,
        default_timeout: float = DEFAULT_TIMEOUT_S,
        namespace: str = DEFAULT_NAMESPACE,
        kafka: KafkaConfig | str | None = None,
        sync: bool = False,
        sync_timeout: float = DEFAULT_SYNC_TIMEOUT_S,
        confirm_within: float = DEFAULT_CONFIRM_WITHIN_S,
        lookup: str | Sequence[str] | None = None,
        lookup_token: str | None = None,
        metrics: Any = None,
        metrics_port: int | None = None,
    ) -> Ledger:
        """Open (or create) the ledger file.

        ``targets``: the destinations this ledger may call, declared once (see
        ``effect_ledger.targets.load``): a targets TOML file, ``module:NAME``, a list of
        ``Target``, or ``None`` for the file named by ``EFFECTS_TARGETS``. ``execute`` on a target
        that is not declared raises ``UnknownTarget``.

        ``durability``: NORMAL survives a killed process, FULL survives power loss too (an fsync per
        write). ``clock`` returns epoch milliseconds. ``default_timeout``: a call's timeout when
        ``execute`` is given none.

        Kafka mode: with ``kafka`` (a ``KafkaConfig`` or bootstrap servers) the file is also an
        outbox, relayed to ``effects.events`` by a task of this event loop. ``sync=True`` waits for
        the broker to acknowledge the intent before the destination is called (at most
        ``sync_timeout`` s; then the effect is FAILED without a call; a refusal that passes by itself, a
        broker failover or a processor catching up, is tried again within it). With ``sync``, an
        attempt's deadline (in its intent) is its call's timeout plus ``confirm_within`` s: the
        broker's acknowledgement and the processor's verdict may take that long (a broker failover
        stops every ``acks=all`` write for the cluster's ``broker.session.timeout.ms``) and the call
        still gets its whole timeout; a confirmation later than that leaves the call less, or none
        (the attempt is then FAILED with nothing sent, and tried again). ``lookup`` is the ledger
        processor's URL: a key this file does not know, or knows only as open, is looked up there
        first, so an agent restarted on another host sees what its predecessor did. Name several
        workers (a list, or URLs separated by commas) and a worker that cannot answer (paused, cut
        off, rejoining its group) is passed over for the next (``ProcessorLookup``). With ``kafka``,
        ``sync=True`` and ``lookup``, agents on several hosts may race for a key: after Kafka
        acknowledged the intent, the destination is called only once the processor has answered,
        for that intent's offset, that it is the first intent of its attempt in the key's partition
        (``effect_ledger.sdk.kafka.claims``); otherwise ``EffectInProgress``, or the winner's receipt
        once there is one.
        ``lookup_token`` is the processor's lookup token (``effects worker --web-token``), by default
        ``$EFFECTS_WEB_TOKEN``. Kafka mode needs the ``[kafka]`` extra (confluent-kafka): without
        it, ``MissingExtra`` is raised before the file is opened.

        Metrics (the ``[metrics]`` extra): ``metrics`` is an
        ``effect_ledger.metrics.names.LedgerMetrics`` the relay updates (outbox depth, dead
        letters) on the application's own registry, to serve as it likes; embedded (no ``kafka``),
        this ledger also counts the effects it makes UNCERTAIN or finds executed twice; ``metrics_port`` serves
        one on ``127.0.0.1:PORT/metrics`` until ``close``.
        """
        path, level = _checked_open(path, durability, targets)  # typed errors, nothing touched yet
        if (
            isinstance(confirm_within, bool)
            or not isinstance(confirm_within, int | float)
            or not 0 <= confirm_within <= MAX_CONFIRM_WITHIN_S
        ):
            raise ConfigError(
                f"confirm_within must be a number of seconds from 0 to {MAX_CONFIRM_WITHIN_S:g}, not {confirm_within!r}"
            )
        if lookup is not None:
            from effect_ledger.sdk.kafka.lookup import lookup_urls

            lookup = lookup_urls(lookup)  # ConfigError, before the file is touched
        declared = resolve_targets(targets)  # a bad declaration fails before the file is touched
        cfg: KafkaConfig | None = None
        if kafka is not None:
            require("kafka", "Ledger.open(kafka=...)")  # likewise a missing Kafka client
            from effect_ledger.sdk.kafka import access

            cfg = kafka if isinstance(kafka, KafkaConfig) else KafkaConfig.from_env(bootstrap=kafka)
            # A credential that may not write the events topic is refused here, the file untouched:
            # nothing this ledger records could ever reach Kafka.
            await access.check(cfg, "agent", "Ledger.open(kafka=...)")
        server = None
        if metrics_port is not None:
            from effect_ledger.metrics.names import LedgerMetrics

            if metrics is None:
                metrics = LedgerMetrics(feature="Ledger.open(metrics_port=...)")
            server = metrics.serve(metrics_port)
        store = await Store.open(path, level)
        if metrics is not None and cfg is None:
            # Embedded, the file is the ledger: its changes (an unknown outcome made UNCERTAIN, a
            # duplicate execution) are counted here. In Kafka mode the worker folds and counts them.
            from effect_ledger.metrics.effects import EffectWatch

            store.observe(id(metrics), EffectWatch(metrics))
        relay: Relay | None = None
        keyring: Keyring | None = None
        if cfg is not None:
            from effect_ledger.sdk.kafka.keyring import KafkaKeyring
            from effect_ledger.sdk.kafka.relay import Relay
            from effect_ledger.streams.schema_topic import kafka_codec

            store.codec = kafka_codec(cfg)  # lookups hand over other releases' events: learn their schemas
            relay = Relay(store, cfg, metrics=metrics)
            keyring = KafkaKeyring(cfg)
        processor: ProcessorLookup | None = None
        if lookup is not None:
            from effect_ledger.sdk.kafka.lookup import ProcessorLookup

            # With Kafka, a lookup names the offsets it waits for (claims.Watermarks): no broker
            # round trip on the processor's side.
            marks = claims.Watermarks(relay.cfg) if relay is not None else None
            processor = ProcessorLookup(
                lookup,
                token=lookup_token,
                watermarks=marks.of if marks else None,
                on_close=marks.close if marks else None,
            )
        ledger = cls(
            store,
            targets=declared,
            clock=clock,
            default_timeout=default_timeout,
            namespace=namespace,
            relay=relay,
            lookup=processor,
            sync_timeout=sync_timeout if sync else None,
            confirm_within=float(confirm_within),
            metrics_server=server,
            keyring=keyring,
        )
        if relay is not None:
            relay.start()
        return ledger

    async def __aenter__(self) -> Ledger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, relay_timeout: float = 10.0) -> None:
        """Give the relay up to ``relay_timeout`` seconds to send what is left (events not yet
        acknowledged stay in the outbox for the next start, or ``effects relay --db``), then
        close the file."""
        self._executor.local.open = False  # from now on its claims are held by their leases alone
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        if self._relay is not None:
            await self._relay.stop(relay_timeout)
        if self._lookup is not None:
            await self._lookup.close()
        await self.keyring.close()
        await self._store.close()

    @property
    def embedded(self) -> bool:
        """No Kafka: the file is the whole ledger (no relay, no processor to look keys up in)."""
        return self._relay is None and self._lookup is None

    @property
    def relay(self) -> Relay | None:
        """The relay to Kafka (Kafka mode), else None."""
        return self._relay

    @property
    def namespace(self) -> str:
        """The namespace this ledger's derived keys are made in (part of the key rule)."""
        return self._namespace

    @property
    def store(self) -> Store:
        """The SQLite file behind this ledger."""
        return self._store

    def now_ms(self) -> int:
        """The ledger's clock, in epoch milliseconds."""
        return self._clock()

    def register(self, target: Target) -> None:
        """Declare (or replace) a target this ledger may call."""
        check_name("target", target.name)
        self._targets[target.name] = target

    def target(self, name: str) -> Target:
        """The declared target ``name``; ``UnknownTarget`` if it was not declared."""
        return self._executor.target(name)

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
        derived from them, see ``effect_ledger.core.keys.effect_key``) or your own ``key``."""
        key, spec = self._checked(target, operation, request, call, run_id, step, key, namespace, timeout)
        # What the intent records of the body: the target's policy (the digest is the full request's).
        declared = self.target(target)
        stored = await bodies.stored(declared.body, self.keyring, key, spec.canonical, spec.digest, self._clock())
        return await self._executor.execute(key, dataclasses.replace(spec, stored=stored), call)

    async def settle(
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
    ) -> Effect | None:
        """What ``execute`` (same arguments) does first, and only that: an earlier attempt that did
        not finish and whose worker is gone is asked about (``call`` replayed where the target
        allows it, as ``execute`` would) and the answer recorded. Nothing new is executed. Returns the
        effect as it then stands (None: the key was never used); an agent framework asks this before
        it decides whether a person must approve the call (ESCALATED)."""
        key, spec = self._checked(target, operation, request, call, run_id, step, key, namespace, timeout)
        return await self._executor.settle(key, spec, call)

    def _checked(
        self,
        target: str,
        operation: str,
        request: Any,
        call: Call,
        run_id: str | None,
        step: str | None,
        key: str | None,
        namespace: str | None,
        timeout: float | None,
    ) -> tuple[str, CallSpec]:
        """The key and the checked call of ``execute``'s arguments (the body as given: see ``execute``)."""
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
            key = checked_effect_key(target, operation, run_id, step, ns)
        else:
            check_key(key)
        canonical, request_digest = canonical_request(request)  # valid, within MAX_REQUEST_BYTES
        t_s = self._default_timeout if timeout is None else timeout
        if isinstance(t_s, bool) or not isinstance(t_s, int | float) or not 0 < t_s <= MAX_TIMEOUT_S:
            raise InvalidEffect(f"timeout must be a number of seconds > 0, got {t_s!r}")
        if not callable(call):
            raise InvalidEffect("call must be a function of the idempotency key")
        return key, CallSpec(target, operation, ns, run_id or "", step or "", canonical, request_digest, float(t_s))

    async def reconcile(self, key: str, call: Call | None = None) -> Effect | None:
        """Ask once about an open effect (used by the runner); records and returns the outcome.
        With ``call``, a target that honours keys and has no reconciler is asked by replaying it."""
        return await self._executor.reconcile(key, call, self._default_timeout)

    # -- later facts -------------------------------------------------------------------------

    async def expire(self, key: str) -> Effect | None:
        """Fire the effect's deadline if it has passed (a Timeout event: it becomes UNCERTAIN)."""
        effect = (await self._store.load(check_key(key))).effect
        if effect is None:
            return None
        timeouts = expire(effect, self._clock())
        return await self._executor.record(effect, list(timeouts)) if timeouts else effect

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
            loaded = await merge_remote(self._store, self._lookup, key, loaded, self._clock)
        if loaded.effect is None:
            await self._executor.refuse_retired(key)
        if loaded.effect is None and not allow_unknown:
            raise UnknownEffect(key, str(self._store.path))
        ev = Receipt(new_event_id(), key, self._clock(), attempt, receipt_id, kind, receipt_text(value)[0])
        return await self._executor.record(loaded.effect, [ev])

    async def decide(
        self, key: str, decision: DecisionKind | str, *, by: str, reason: str, receipt_id: str | None = None
    ) -> Effect:
        """Record a person's decision on an effect (usually an escalated one). ``by`` and ``reason``
        are required, at most ``limits.MAX_TEXT_BYTES`` each; an unknown key is ``UnknownEffect``.
        ``DecisionRefused`` for ABSENT while the attempt may still land at the destination (see
        ``effect_ledger.core.effect.decision_refusal``). The decision carries ``by`` and the
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
        if self._lookup is not None:  # decide on everything known, not this file only
            loaded = await merge_remote(self._store, self._lookup, key, loaded, self._clock)
        before = loaded.effect
        if before is None:
            raise UnknownEffect(key, str(self._store.path))
        # Checked on this ledger's clock against its file; in Kafka mode the processor counts it only
        # once the log took it after the call could no longer land (``core.effect``).
        now = self._clock()
        grace = target_for(self._targets, target_name(before))[0].lands_within_ms
        refused = decision_refusal(before, kind, now, grace)
        if refused is not None:
            raise DecisionRefused(key, refused.reason, refused.retry_after_ms)
        if self._relay is not None:
            from effect_ledger.sdk.kafka import access

            # Only principals Kafka's ACLs allow may write effects.decisions: one that may not is
            # told now, not by a refusal in the outbox after an "ok".
            await access.check(self._relay.cfg, "decide_sdk", "Ledger.decide")
        principal = operator_identity(self._relay.cfg if self._relay is not None else None)
        ev = Decision(new_event_id(), key, now, before.attempt, kind, by, reason, receipt_id, principal)
        return await self._executor.record(before, [ev])

    async def get(self, key: str) -> Effect | None:
        """The effect of ``key`` as this file knows it (None: unknown). ``InvalidEffect`` for
        something no effect can have as its key (every key written was checked the same way)."""
        return (await self._store.load(check_key(key))).effect

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

        async def run(op: str, request: Any, call: Call, **own: Any) -> Any:
            confirmation = await self.execute(
                target=target, operation=op, request=request, timeout=timeout, call=call, **own
            )
            return confirmation.value

        def wrap(fn: F) -> Callable[..., Awaitable[Any]]:
            return keyed(fn, operation, key_arg, {"run_id": None, "step": None, "key": None}, run)

        return wrap


E = TypeVar("E", ReceiptSource, DecisionKind)


def _enum(cls: type[E], kind: str, value: object) -> E:
    try:
        return cls(value)  # type: ignore[arg-type]  # anything a caller passes; a bad one is refused below
    except ValueError:
        names = ", ".join(m.value for m in cls)
        raise InvalidEffect(f"invalid {kind} {show(value)}: one of {names}") from None


__all__ = ["Ledger", "Confirmation", "DEFAULT_TIMEOUT_S"]


def _checked_open(path: object, durability: object, targets: object) -> tuple[str, Durability]:
    """``Ledger.open``'s arguments of the wrong kind, as typed errors (``ConfigError``,
    ``TargetsError``) rather than a ``TypeError`` or ``ValueError`` from deeper down."""
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"the ledger path must be a str or os.PathLike, not {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ConfigError("the ledger path must be text, not bytes")
    if not text or "\0" in text:
        raise ConfigError(f"the ledger path {text!r} is empty or holds a NUL character")
    try:
        level = Durability(durability)  # type: ignore[arg-type]  # any value: a wrong one is refused below
    except ValueError:
        raise ConfigError(f"durability must be one of {', '.join(Durability)}, not {durability!r}") from None
    if targets is not None and not isinstance(targets, str | os.PathLike | Iterable):
        raise TargetsError(f"targets must be a targets file, 'module:NAME' or a list of Target, not {targets!r}")
    return text, level
