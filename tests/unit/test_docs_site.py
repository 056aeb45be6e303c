"""The documentation site builds with no broken link: ``mkdocs build --strict`` (what ``make docs``
runs) over ``docs/`` with ``mkdocs.yml``, into a temporary folder. Strict mode fails on a link to a
page or an anchor that does not exist and on a nav entry without its page. The command-line
reference is generated from the click commands during the build; every command must be on it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click

from effect_ledger.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _commands(group: click.Group, prefix: str) -> list[str]:
    out = []
    ctx = click.Context(group, info_name=prefix)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        out.append(f"{prefix} {name}")
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{prefix} {name}")
    return out


def test_the_site_builds_strict_with_every_command_on_the_cli_page(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    build = ["build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "-d", str(site)]
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", *build],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    assert "WARNING" not in r.stderr, r.stderr[-4000:]
    cli_page = (site / "reference/cli/index.html").read_text()
    commands = _commands(main, "effects")
    assert len(commands) >= 20  # not vacuous
    missing = [c for c in commands if f"<code>{c}</code>" not in cli_page]
    assert not missing, missing
    # The table of metrics, generated into its page: every metric the code exports.
    from effect_ledger.metrics.names import METRICS

    metrics_page = (site / "reference/metrics/index.html").read_text()
    assert len(METRICS) >= 10 and not [n for n in METRICS if f"<code>{n}</code>" not in metrics_page]
    # The pages the README links to and the reports are in the site.
    for page in ("concepts/key-rule", "concepts/crash-matrix", "guides/kafka-mode", "reference/configuration",
                 "reference/metrics", "chaos", "soak/soak-report", "changelog"):  # fmt: skip
        assert (site / page / "index.html").is_file(), page


def test_the_configuration_page_names_every_setting_of_a_target() -> None:
    from effect_ledger.targets import load

    page = (ROOT / "docs/reference/configuration.md").read_text()
    table = page.split("## Every setting", 1)[1]
    named = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    assert named == load._COMMON | load._HTTP
    assert all(f"`{k}`" in table for k in load._BACKOFF)
