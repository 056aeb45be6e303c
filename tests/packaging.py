"""What the packaging tests share (``tests/unit/test_packaging.py``, ``tests/unit/test_wheel.py``):
where the repository's folders are installed, and what the embedded probe must report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests/unit/embedded_probe.py"
# The folders the repository keeps at the top level, and the package each is installed as.
ROOTS = {
    "effect_ledger": "effect_ledger",
    "schemas": "effect_ledger.schemas",
    "streams": "effect_ledger.streams",
    "processors": "effect_ledger.processors",
}
KAFKA_MODULES = ("confluent_kafka", "faust", "aiokafka", "rocksdict")


def package_folders() -> dict[str, Path]:
    """``{installed package name: folder}`` for every folder under the roots that holds files: the
    packages (an ``__init__.py``) and the folders of package data only, which Python can import as
    namespace packages, so setuptools must be told about them too (else it warns on every build)."""
    found = {}
    for folder, package in ROOTS.items():
        base = ROOT / folder
        for d in sorted({p.parent for p in base.rglob("*") if p.is_file()}):
            rel = d.relative_to(base)
            if "__pycache__" not in rel.parts:
                found[".".join([package, *rel.parts])] = d
    return found


def source_files(suffix: str) -> list[Path]:
    """Every file with ``suffix`` under the roots (``.py``, ``.avsc``)."""
    return sorted(p for folder in ROOTS for p in (ROOT / folder).rglob(f"*{suffix}") if "__pycache__" not in p.parts)


def installed_path(path: Path) -> str:
    """Where a repository file lands when installed (``schemas/Intent.avsc`` ->
    ``effect_ledger/schemas/Intent.avsc``)."""
    rel = path.relative_to(ROOT)
    return "/".join([*ROOTS[rel.parts[0]].split("."), *rel.parts[1:]])


def check_embedded(report: dict[str, Any]) -> None:
    """What ``embedded_probe.py`` must have seen, in the dev venv and in the wheel's venv alike."""
    assert report["unresolved"] == []
    assert report["ledger"] == {"receipt": "re_1", "called": True, "again": ["re_1", False]}
    assert report["sync_ledger"] == "re_3"
    for name, result in report["cli"].items():
        assert result["exit"] == 0, (name, result)
    assert "worker" in report["cli"]["help"]["output"] and "demo" in report["cli"]["help"]["output"]
    assert json.loads(report["cli"]["trace"]["output"])["state"] == "CONFIRMED"
    assert json.loads(report["cli"]["audit"]["output"])["passed"] is True
    assert report["kafka_modules"] == []


def check_missing_kafka_extra(report: dict[str, Any]) -> None:
    """Without confluent-kafka, ``Ledger.open(kafka=...)`` is a ``MissingExtra`` naming the extra,
    raised before the ledger file is created."""
    assert report["kafka_mode"] == {
        "error": "MissingExtra",
        "extra": "kafka",
        "message": "Ledger.open(kafka=...) needs the kafka extra: pip install 'effect-ledger-kafka[kafka]'",
    }
    assert report["kafka_db_created"] is False


def missing_extra_line(command: str, extra: str) -> str:
    """What a Kafka command prints (the whole of stderr) when its extra is not installed."""
    return f"effects: {command} needs the {extra} extra: pip install 'effect-ledger-kafka[{extra}]'\n"
