"""The targets-file examples of docs/guides/reconcilers-mail-sql.md and targets.example.toml parse
into the kinds they describe (the guide's examples are what users copy)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effect_ledger.targets.load import parse_targets
from effect_ledger.targets.mail import MailDestination
from effect_ledger.targets.sql import SqlDestination

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "guides" / "reconcilers-mail-sql.md"


def test_every_toml_example_in_the_guide_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SMTP_PASSWORD", "ARCHIVE_PASSWORD"):
        monkeypatch.setenv(var, "secret")
    blocks = re.findall(r"```toml\n(.*?)```", GUIDE.read_text(), re.S)
    kinds = [type(t.reconciler) for block in blocks for t in parse_targets(block, GUIDE)]
    assert kinds == [MailDestination, SqlDestination, SqlDestination]


def test_the_commented_kinds_in_targets_example_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SMTP_PASSWORD", "ARCHIVE_PASSWORD"):
        monkeypatch.setenv(var, "secret")
    text = (ROOT / "targets.example.toml").read_text()
    part = text[text.index("# [targets.mail]") :].splitlines()
    toml = "\n".join(ln[2:] for ln in part if ln.startswith("# ") and ("=" in ln or ln.startswith("# [")))
    targets = {t.name: t for t in parse_targets(toml)}
    assert isinstance(targets["mail"].reconciler, MailDestination)
    assert isinstance(targets["orders"].reconciler, SqlDestination) and targets["orders"].retention_s is None
