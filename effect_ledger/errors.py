"""Typed errors of the producer SDK. Every refusal is one of these, raised before anything is sent.

Each survives pickling with its fields (``__reduce__``): engines that record a step's exception and
raise it again on replay (DBOS), and process pools, pickle it."""

from __future__ import annotations

from collections.abc import Sequence


class LedgerError(Exception):
    """Base class of effect-ledger errors."""


class InvalidEffect(LedgerError, ValueError):
    """Bad input: a target or operation name, a key, a request that is not JSON, a bad timeout."""


class EffectTooLarge(InvalidEffect):
    """An input over its documented size limit (``effect_ledger.core.limits``): refused before
    anything is written or called."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what} is {size} bytes, over the {limit}-byte limit (see effect_ledger.core.limits): "
            "nothing was written or called"
        )
        self.what = what
        self.size = size
        self.limit = limit


class UnknownEffect(InvalidEffect):
    """``record_receipt`` or ``decide`` named a key this ledger has never seen. A receipt that may
    legitimately arrive before its intent (another host executed it) is recorded with
    ``record_receipt(..., allow_unknown=True)``."""

    def __init__(self, effect_id: str, where: str) -> None:
        super().__init__(f"no effect with key {effect_id!r} in {where}")
        self.effect_id = effect_id


class ReceiptNotRecordable(LedgerError):
    """The call succeeded and the effect is recorded CONFIRMED, but what it returned could not be
    recorded exactly: not JSON (mixed key types, a circular structure, an object), over the size
    limit, or the target's ``receipt_id`` function raised. The ledger holds a flagged
    representation (INEXACT_RECEIPT) and a receipt id (a digest when none could be had) and will
    not call again; a later ``execute`` returns that record. ``confirmation`` is this call's result,
    with the value exactly as the call returned it. Raised so the integration can be fixed: make
    the call return JSON-serialisable data within the limits."""

    def __init__(self, confirmation: object, reason: str) -> None:
        effect_id = getattr(confirmation, "effect_id", "?")
        receipt_id = getattr(confirmation, "receipt_id", "?")
        super().__init__(
            f"effect {effect_id} executed and is recorded CONFIRMED (receipt {receipt_id}), but what the call "
            f"returned could not be recorded exactly: {reason}; the ledger keeps a flagged representation and "
            "will not call again"
        )
        self.confirmation = confirmation
        self.effect_id = effect_id
        self.reason = reason


class LedgerClosed(LedgerError):
    """The ledger was closed; open a new one."""


class EffectConflict(LedgerError):
    """The same key was used with a different request (like a provider's 409/422): never a second
    effect."""

    def __init__(self, effect_id: str, recorded_digest: str, given_digest: str) -> None:
        super().__init__(
            f"effect {effect_id} was recorded with request digest {recorded_digest[:12]}…, "
            f"this call has {given_digest[:12]}…: the same key with a different request"
        )
        self.effect_id = effect_id
        self.recorded_digest = recorded_digest
        self.given_digest = given_digest

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return type(self), (self.effect_id, self.recorded_digest, self.given_digest)


class EffectInProgress(LedgerError):
    """Another live worker holds this key's current attempt, or an earlier attempt may still land
    at the destination until its deadline plus the target's ``lands_within``. Retry after
    ``retry_after_ms``."""

    def __init__(self, effect_id: str, reason: str, retry_after_ms: int | None = None) -> None:
        super().__init__(f"effect {effect_id} is in progress: {reason}")
        self.effect_id = effect_id
        self.reason = reason
        self.retry_after_ms = retry_after_ms

    def __reduce__(self) -> tuple[type, tuple[str, str, int | None]]:
        return type(self), (self.effect_id, self.reason, self.retry_after_ms)


class EffectUncertain(LedgerError):
    """Nobody can tell (yet) whether the effect happened; nothing was sent. The run must hold until
    a reconciler or a person resolves it (``effects resolve``)."""

    def __init__(self, effect_id: str, reason: str, state: str) -> None:
        super().__init__(f"effect {effect_id} is {state}: {reason}")
        self.effect_id = effect_id
        self.reason = reason
        self.state = state

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return type(self), (self.effect_id, self.reason, self.state)


class EffectClosed(LedgerError):
    """A person closed this effect (abandoned or compensated); it will not be executed."""

    def __init__(self, effect_id: str, state: str, reason: str | None) -> None:
        super().__init__(f"effect {effect_id} is {state}{': ' + reason if reason else ''}")
        self.effect_id = effect_id
        self.state = state
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str, str | None]]:
        return type(self), (self.effect_id, self.state, self.reason)


class EffectRetired(LedgerError):
    """The key belongs to a closed effect that was retired (its events deleted after the retention
    period, see ``effect_ledger.core.retention``). A retired key is never executed again, whatever
    its last state was: use a new key (a new step) for a new write."""

    def __init__(self, effect_id: str, state: str, retired_ms: int) -> None:
        super().__init__(
            f"effect {effect_id} was {state} and has been retired (at {retired_ms} ms since the epoch): "
            "a retired key is never executed again; use a new key for a new write"
        )
        self.effect_id = effect_id
        self.state = state
        self.retired_ms = retired_ms

    def __reduce__(self) -> tuple[type, tuple[str, str, int]]:
        return type(self), (self.effect_id, self.state, self.retired_ms)


class BodyErased(LedgerError):
    """A request body was encrypted with a subject's key, and that key has been erased
    (``effects erase``): the body can no longer be read. States, times and digests remain."""


class DecisionRefused(LedgerError, ValueError):
    """A person's decision that could cause a second execution was refused: ABSENT while the
    attempt may still land at the destination. Retry after ``retry_after_ms`` when known."""

    def __init__(self, effect_id: str, reason: str, retry_after_ms: int | None = None) -> None:
        super().__init__(f"decision on {effect_id} refused: {reason}")
        self.effect_id = effect_id
        self.reason = reason
        self.retry_after_ms = retry_after_ms


class DefiniteFailure(LedgerError):
    """Raise it (or a subclass) from a call to say the destination definitively rejected the request
    and nothing happened: the effect is recorded FAILED and a later call may execute again."""


class DestinationError(DefiniteFailure):
    """A built-in destination kind (``kind = "smtp"``, ``kind = "sql"``) refused to make a call before
    sending anything: a message over its size bound, a key or a value it cannot carry, a row whose
    columns are not plain names. Nothing reached the destination, so the effect is FAILED."""


class MailRejected(DefiniteFailure):
    """The SMTP server refused the message with a permanent (5xx) reply before accepting it: no
    recipient got it; the effect is FAILED."""


class OutOfStock(DefiniteFailure):
    """A guarded stock decrement (``kind = "sql"`` with ``stock``) would have gone below zero: the
    transaction was rolled back, nothing changed; the effect is FAILED."""


class LedgerUnavailable(LedgerError):
    """Kafka mode: the broker did not acknowledge the intent in time (``sync``), or the processor
    could not be asked about a key; nothing was sent to the destination.

    ``passing`` is True when the cause passes by itself (the broker electing a new leader, the
    processor catching up or rebalancing): ``execute`` has already tried again within its
    ``sync_timeout`` before raising it, and a caller may try again later."""

    passing: bool = False

    def __init__(self, message: str = "", *, passing: bool | None = None) -> None:
        super().__init__(message)
        if passing is not None:
            self.passing = passing

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_unavailable, (type(self), str(self), self.passing))


def _rebuild_unavailable(cls: type[LedgerUnavailable], message: str, passing: bool) -> LedgerUnavailable:
    e = cls.__new__(cls)
    LedgerUnavailable.__init__(e, message, passing=passing)
    return e


class BrokerUnavailable(LedgerUnavailable, RuntimeError):
    """No Kafka broker answered a metadata request in time."""


class BrokerRefusedLogin(BrokerUnavailable):
    """A broker answered but refused this client's credentials or TLS (a wrong password, a CA that
    does not sign the broker's certificate, a certificate for another host): the message says
    which, as the broker's client library reported it. Retrying will not help."""


class NotAuthorized(LedgerError):
    """Kafka's ACLs do not give this client's principal a right it needs (``missing``: lines such
    as ``Write on topic effects.decisions``). Nothing was written or called; ``effects acl`` prints
    the rights of each role."""

    def __init__(self, what: str, principal: str, missing: Sequence[str]) -> None:
        super().__init__(f"{what}: Kafka does not allow {principal} {'; '.join(missing)} (see `effects acl`)")
        self.what = what
        self.principal = principal
        self.missing = tuple(missing)

    def __reduce__(self) -> tuple[type, tuple[str, str, tuple[str, ...]]]:
        return (type(self), (self.what, self.principal, self.missing))


class LedgerLagging(LedgerUnavailable):
    """The processor has not yet consumed every event Kafka acknowledged before the lookup began:
    answering now could miss one, so the SDK refuses to guess."""

    passing = True


class UnknownTarget(InvalidEffect):
    """``execute`` named a target that was not declared (``targets=`` / the targets file)."""


class TargetsError(LedgerError):
    """The targets declaration is missing or malformed; the message names the file and the line."""


class ConfigError(LedgerError):
    """A service's settings are unsafe or inconsistent, e.g. the processor's lookup view bound beyond
    loopback without a token. Nothing was started."""


class StorageError(LedgerError):
    """The ledger file could not be read or written (disk full, a corrupt page, not a ledger file).
    ``__cause__`` is the database error."""


class MissingExtra(LedgerError, ImportError):
    """A Kafka feature was asked for, but the optional dependencies it needs are not installed
    (the base install is the embedded SDK and the operator CLI). The message names the extra:
    ``pip install 'effect-ledger-kafka[kafka]'`` or ``[processor]``."""

    def __init__(self, extra: str, feature: str, distribution: str) -> None:
        super().__init__(f"{feature} needs the {extra} extra: pip install '{distribution}[{extra}]'")
        self.extra = extra
        self.feature = feature


# Raised by the topics' plumbing (``effect_ledger.streams``) and the ledger processor.


class DecodeError(LedgerError, ValueError):
    """The bytes are not a record this codec knows: wrong magic, unknown fingerprint, truncated or
    trailing bytes, or a body that does not match its schema."""


class UnknownSchema(DecodeError):
    """The record's writer schema is neither one this release ships nor one its resolver could find
    (in ``effects.schemas``, within its bounded wait). ``fingerprint``: the 8 bytes of the header."""

    def __init__(self, fingerprint: bytes, detail: str = "") -> None:
        super().__init__(f"unknown schema fingerprint {fingerprint.hex()}{detail}")
        self.fingerprint = fingerprint

    def __reduce__(self) -> tuple[type, tuple[bytes]]:
        return (type(self), (self.fingerprint,))


class EncodeError(LedgerError, ValueError):
    """The object does not fit its schema (a missing field, a wrong type)."""


class SchemaTopicError(LedgerError):
    """A writer could not publish its schemas to ``effects.schemas`` (missing topic, no broker, no
    permission): it must not write records that readers could not learn to decode."""


class RegistryError(LedgerError):
    """The Schema Registry could not be reached, refused a schema, or answered something else."""


class TopicDrift(LedgerError):
    """A topic exists with settings other than the ones effect-ledger relies on (``check_topics``)."""

    def __init__(self, drifts: Sequence[object]) -> None:  # streams.admin.Drift: errors imports nothing
        super().__init__("; ".join(str(d) for d in drifts) + " (see `effects topics check`)")
        self.drifts = drifts


class OutputRefused(LedgerError):
    """Kafka refused a record of the processor's batch for good: the batch is not acknowledged."""


class AssessError(LedgerError, ValueError):
    """``effects assess`` cannot read the log as asked: a bad ``--field``/``--format``, a log over the
    size bound, or an output file it will not write."""
