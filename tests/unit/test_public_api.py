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
    "BrokerRefusedLogin",
    "BrokerUnavailable",
    "CallableReconciler",
    "ConfigError",
    "Confirmation",
    "DecisionKind",
    "DecisionRefused",
    "DefiniteFailure",
    "DestinationError",
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
    "MailDestination",
    "MailRejected",
    "MissingExtra",
    "NotAuthorized",
    "OutOfStock",
    "ReceiptNotRecordable",
    "ReceiptSource",
    "Reconciler",
    "SqlDestination",
    "State",
    "Stock",
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


def test_every_ledger_error_lives_in_errors() -> None:
    """One error family in one module: a class deriving from any ``LedgerError`` anywhere else in the
    code is a second home for errors (found by reading every module's class definitions)."""
    import ast
    from pathlib import Path

    from effect_ledger import errors

    family = {
        name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, errors.LedgerError)
    }
    # DefiniteFailure is what a destination's client raises for "rejected, nothing happened" (the demo's
    # gateway client, the MCP proxy's refused tool call): deriving from it is its documented use.
    family.discard("DefiniteFailure")
    root = Path(effect_ledger.__file__).resolve().parent.parent
    elsewhere = []
    for folder in ("effect_ledger", "streams", "processors", "schemas"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == Path(errors.__file__).resolve():
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                    if bases & family:
                        elsewhere.append(f"{path.relative_to(root)}: {node.name}")
    assert len(family) > 20
    assert elsewhere == []
