"""Typed errors of the producer SDK. Every refusal is one of these, raised before anything is sent."""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of effect-ledger errors."""


class InvalidEffect(LedgerError, ValueError):
    """Bad input: a target or operation name, a key, a request that is not JSON, a bad timeout."""


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


class EffectInProgress(LedgerError):
    """Another live worker holds this key's current attempt, or an earlier attempt may still land
    at the destination until its deadline. Retry after ``retry_after_ms``."""

    def __init__(self, effect_id: str, reason: str, retry_after_ms: int | None = None) -> None:
        super().__init__(f"effect {effect_id} is in progress: {reason}")
        self.effect_id = effect_id
        self.retry_after_ms = retry_after_ms


class EffectUncertain(LedgerError):
    """Nobody can tell (yet) whether the effect happened; nothing was sent. The run must hold until
    a reconciler or a person resolves it (``effects resolve``)."""

    def __init__(self, effect_id: str, reason: str, state: str) -> None:
        super().__init__(f"effect {effect_id} is {state}: {reason}")
        self.effect_id = effect_id
        self.reason = reason
        self.state = state


class EffectClosed(LedgerError):
    """A person closed this effect (abandoned or compensated); it will not be executed."""

    def __init__(self, effect_id: str, state: str, reason: str | None) -> None:
        super().__init__(f"effect {effect_id} is {state}{': ' + reason if reason else ''}")
        self.effect_id = effect_id
        self.state = state


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


class LedgerUnavailable(LedgerError):
    """Kafka mode: the broker did not acknowledge the intent in time (``sync``), or the processor
    could not be asked about a key; nothing was sent to the destination."""


class LedgerLagging(LedgerUnavailable):
    """The processor has not yet consumed every event Kafka acknowledged before the lookup began:
    answering now could miss one, so the SDK refuses to guess."""


class UnknownTarget(InvalidEffect):
    """``execute`` named a target that was not declared (``targets=`` / the targets file)."""


class TargetsError(LedgerError):
    """The targets declaration is missing or malformed; the message names the file and the line."""


class StorageError(LedgerError):
    """The ledger file could not be read or written (disk full, a corrupt page, not a ledger file).
    ``__cause__`` is the database error."""
