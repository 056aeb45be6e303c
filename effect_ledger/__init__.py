"""effect-ledger: an event-sourced ledger of external side effects.

Every external write becomes intent -> executed -> receipt events, keyed by a stable idempotency
key; an effect whose outcome is unknown is reconciled with the destination, never retried blindly.

    from effect_ledger import Ledger

    ledger = await Ledger.open("effects.db", targets="targets.toml")
    receipt = await ledger.execute(
        target="payments", operation="refund.create", run_id=run.id, step="refund-order-123",
        request={"order": "123", "amount": 4800}, call=lambda key: gateway.refund(..., key),
    )

This module is the public door: the names in ``__all__`` are the supported API
(``tests/unit/test_public_api.py`` pins them); their modules may move, these names stay. Every
``LedgerError`` lives in ``effect_ledger.errors``. The rooms, each with its walls in ``make lint``:
``core`` (pure), ``targets``, ``sdk`` (with ``store`` and ``kafka``), ``metrics``, the apps
(``integrations``, ``cli``, ``console``, ``mcp``, ``ops``, ``demo``), and the brief's folders installed
under this root: ``schemas`` (the Avro contract), ``streams`` (the topics) and ``processors`` (the
faust processor and the reconcile consumers).
"""

from __future__ import annotations

from effect_ledger.core.effect import Effect
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import DecisionKind, ReceiptSource, State
from effect_ledger.core.reconcile import Absent, Answer, Backoff, EffectView, Found, Reconciler, Target, Unknown
from effect_ledger.errors import (
    BodyErased,
    BrokerRefusedLogin,
    BrokerUnavailable,
    ConfigError,
    DecisionRefused,
    DefiniteFailure,
    DestinationError,
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectRetired,
    EffectTooLarge,
    EffectUncertain,
    InvalidEffect,
    LedgerClosed,
    LedgerError,
    LedgerLagging,
    LedgerUnavailable,
    MailRejected,
    MissingExtra,
    NotAuthorized,
    OutOfStock,
    ReceiptNotRecordable,
    StorageError,
    TargetsError,
    UnknownEffect,
    UnknownTarget,
)
from effect_ledger.sdk.ledger import Confirmation, Ledger
from effect_ledger.sdk.store.sqlite import Durability
from effect_ledger.sdk.sync import SyncLedger
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.targets.ask import CallableReconciler
from effect_ledger.targets.http import HttpReconciler
from effect_ledger.targets.load import load_targets
from effect_ledger.targets.mail import MailDestination
from effect_ledger.targets.sql import SqlDestination, Stock

__version__ = "0.1.0"

__all__ = [
    # the SDK
    "Ledger",
    "SyncLedger",
    "Confirmation",
    "Durability",
    "KafkaConfig",
    "effect_key",
    # targets and reconciliation
    "Target",
    "Backoff",
    "load_targets",
    "Reconciler",
    "HttpReconciler",
    "CallableReconciler",
    "MailDestination",
    "SqlDestination",
    "Stock",
    "EffectView",
    "Answer",
    "Found",
    "Absent",
    "Unknown",
    # what the ledger knows
    "Effect",
    "State",
    "DecisionKind",
    "ReceiptSource",
    # errors
    "LedgerError",
    "InvalidEffect",
    "EffectTooLarge",
    "UnknownTarget",
    "UnknownEffect",
    "TargetsError",
    "StorageError",
    "EffectConflict",
    "EffectInProgress",
    "EffectUncertain",
    "ReceiptNotRecordable",
    "EffectClosed",
    "EffectRetired",
    "BodyErased",
    "DefiniteFailure",
    "LedgerClosed",
    "LedgerUnavailable",
    "LedgerLagging",
    "BrokerUnavailable",
    "BrokerRefusedLogin",
    "NotAuthorized",
    "MissingExtra",
    "ConfigError",
    "DecisionRefused",
    "DestinationError",
    "MailRejected",
    "OutOfStock",
]
