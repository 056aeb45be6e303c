"""The public door, ``effect_ledger``: its export list is pinned, so adding or removing a name is a
decision made here, not a side effect of moving a module. Every exported class and function says
what it is for."""

from __future__ import annotations

import dataclasses
import inspect

import effect_ledger

EXPORTS = [
    "Absent",
    "Answer",
    "Backoff",
    "BodyErased",
    "CallableReconciler",
    "Confirmation",
    "DecisionKind",
    "DefiniteFailure",
    "Durability",
    "Effect",
    "EffectClosed",
    "EffectConflict",
    "EffectInProgress",
    "EffectRetired",
    "EffectTooLarge",
    "EffectUncertain",
    "EffectView",
    "Found",
    "HttpReconciler",
    "InvalidEffect",
    "KafkaConfig",
    "Ledger",
    "LedgerClosed",
    "LedgerError",
    "LedgerLagging",
    "LedgerUnavailable",
    "MissingExtra",
    "ReceiptNotRecordable",
    "ReceiptSource",
    "Reconciler",
    "State",
    "StorageError",
    "SyncLedger",
    "Target",
    "TargetsError",
    "Unknown",
    "UnknownEffect",
    "UnknownTarget",
    "effect_key",
    "load_targets",
]


def test_all_is_pinned() -> None:
    assert sorted(effect_ledger.__all__) == EXPORTS
    assert len(set(effect_ledger.__all__)) == len(effect_ledger.__all__), "a name is exported twice"


def test_every_name_resolves() -> None:
    namespace: dict[str, object] = {}
    exec("from effect_ledger import *", namespace)
    missing = [n for n in EXPORTS if n not in namespace]
    assert missing == []
    for name in EXPORTS:
        assert namespace[name] is getattr(effect_ledger, name)


def _own_docstring(obj: object) -> str:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""  # not inherited from a base class
        if dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return ""  # the signature dataclasses writes when a class has no docstring
        return doc.strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def test_classes_and_functions_have_docstrings() -> None:
    undocumented = [
        name
        for name in EXPORTS
        if (inspect.isclass(obj := getattr(effect_ledger, name)) or inspect.isfunction(obj)) and not _own_docstring(obj)
    ]
    assert undocumented == []
    # Not vacuous: most of the door is classes and functions.
    documented = [n for n in EXPORTS if inspect.isclass(getattr(effect_ledger, n))]
    assert len(documented) > 25


def test_exported_errors_are_one_family() -> None:
    errors = [
        obj
        for name in EXPORTS
        if inspect.isclass(obj := getattr(effect_ledger, name)) and issubclass(obj, BaseException)
    ]
    assert [e.__name__ for e in errors if not issubclass(e, effect_ledger.LedgerError)] == []
    assert len(errors) >= 14
    # A missing extra is also an ImportError, for code that guards an optional import.
    assert issubclass(effect_ledger.MissingExtra, ImportError)
