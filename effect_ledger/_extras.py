"""The optional parts of the install, named once.

The base install (``pip install effect-ledger-kafka``) is the embedded SDK and the operator CLI
and imports no Kafka client. ``[kafka]`` adds Kafka mode for agents and the Kafka side of the
CLI (confluent-kafka); ``[processor]`` adds the ledger processor (faust-streaming, aiokafka,
rocksdict); ``[postgres]`` adds the PostgreSQL sink (psycopg); ``[metrics]`` adds the Prometheus
endpoints (prometheus-client). Code that needs an extra imports it where it is used, so the base
install never loads it; this module turns "not installed" into a ``MissingExtra`` naming what to
install.
"""

from __future__ import annotations

import importlib.util

from effect_ledger.errors import MissingExtra

DISTRIBUTION = "effect-ledger-kafka"

# The top-level modules each extra installs (pyproject.toml's optional-dependencies).
EXTRAS: dict[str, tuple[str, ...]] = {
    "kafka": ("confluent_kafka",),
    "processor": ("confluent_kafka", "faust", "aiokafka", "rocksdict"),
    "postgres": ("psycopg",),  # `effects sink --to postgresql://...`
    "metrics": ("prometheus_client",),
    "erasure": ("cryptography",),  # encrypted, erasable request bodies (body = "encrypt")
}


def _smallest_extra(module: str) -> str | None:
    for extra, modules in EXTRAS.items():  # kafka first: the smaller extra that has it
        if module in modules:
            return extra
    return None


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (without importing any of them)."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require(extra: str, feature: str) -> None:
    """Raise ``MissingExtra`` unless every module of ``extra`` is installed. ``feature`` names what
    needs it, for the message (``"effects worker"``, ``"Ledger.open(kafka=...)"``)."""
    if missing(extra):
        raise MissingExtra(extra, feature, DISTRIBUTION)


def explain(error: ImportError, feature: str) -> MissingExtra | None:
    """The ``MissingExtra`` behind ``error`` when it is one of the optional modules that is not
    installed; ``None`` for any other import error (a real bug: let it show)."""
    if isinstance(error, MissingExtra):
        return error  # it already names what needed the extra
    extra = _smallest_extra((error.name or "").partition(".")[0])
    if extra is None or not missing(extra):
        return None
    return MissingExtra(extra, feature, DISTRIBUTION)
