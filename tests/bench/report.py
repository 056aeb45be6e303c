"""The results table (rich) and the JSON file."""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tests.bench.common import CPU_COUNT, BenchResult, fmt


def _pcts(p: dict[str, float]) -> str:
    if not p:
        return "-"
    parts = []
    for k, v in p.items():
        if k.startswith("max"):
            continue
        label = k.split("_")[0] + ("-grace" if "minus_grace" in k else "")
        parts.append(f"{label} {fmt(v)}")
    return " / ".join(parts)


def table(results: list[BenchResult], title: str) -> Table:
    t = Table(title=title, show_lines=False, header_style="bold")
    for col, kw in (
        ("benchmark", {"no_wrap": True}),
        ("metric", {}),
        ("median", {"justify": "right"}),
        ("unit", {}),
        ("p-values", {}),
        ("raw limit", {"justify": "right"}),
        ("ratio", {"justify": "right"}),
        ("target", {}),
        ("pass", {"justify": "center"}),
        ("reps", {"justify": "right"}),
    ):
        t.add_column(col, **kw)  # type: ignore[arg-type]
    for r in results:
        if r.status != "ran":
            style = "yellow" if r.status == "skipped" else "red"
            t.add_row(r.name, f"[{style}]{r.status}: {r.note}[/{style}]", *[""] * 8)
            continue
        for i, m in enumerate(r.metrics):
            ok = m.passed
            mark = "-" if ok is None else ("[green]PASS[/green]" if ok else "[red]FAIL[/red]")
            ratio = m.ratio
            t.add_row(
                r.name if i == 0 else "",
                m.metric,
                fmt(m.median),
                m.unit,
                _pcts(m.percentiles),
                fmt(m.raw),
                "-" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}",
                m.target_text,
                mark,
                str(len(m.runs)),
            )
            if m.extra.get("note"):
                t.add_row("", f"[dim]  {m.extra['note']}[/dim]", *[""] * 8)
        if r.note:
            t.add_row("", f"[dim]{r.note}[/dim]", *[""] * 8)
    return t


def print_table(console: Console, results: list[BenchResult], title: str) -> None:
    console.print(table(results, title))


def write_json(path: Path, results: list[BenchResult], meta: dict[str, Any]) -> None:
    doc = {
        **meta,
        "machine": {
            "cpu_count": CPU_COUNT,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "benchmarks": [r.to_json() for r in results],
    }
    path.write_text(json.dumps(_clean(doc), indent=2, allow_nan=False, default=str) + "\n")


def _clean(o: Any) -> Any:
    """NaN and infinities become null (strict JSON); floats are rounded for reading."""
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else round(o, 3)
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    return o


def read_previous(path: Path) -> dict[str, Any] | None:
    """The results file of an earlier run, if there is a readable one (anything else: None)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list) else None


def print_comparison(console: Console, results: list[BenchResult], previous: dict[str, Any]) -> None:
    """Each figure of this run beside the same figure of ``previous`` (the file this run replaced):
    the medians and, where both have one, the ratios to the raw limit, the steadier of the two when
    the machine's load differed between the runs."""
    before: dict[tuple[str, str], dict[str, Any]] = {}
    for b in previous["benchmarks"]:
        for m in b.get("metrics") or []:
            if isinstance(m, dict) and "metric" in m:
                before[(str(b.get("name")), str(m["metric"]))] = m
    t = Table(title=f"against the previous run ({previous.get('started', '?')})", header_style="bold")
    for col in ("benchmark", "metric", "before", "now", "unit", "ratio before", "ratio now"):
        t.add_column(col, justify="left" if col in ("benchmark", "metric", "unit") else "right")
    if not any((r.name, m.metric) in before for r in results for m in r.metrics):
        console.print(f"the previous run ({previous.get('started', '?')}) has none of these figures")
        return
    for r in results:
        for m in r.metrics:
            old = before.get((r.name, m.metric))
            if old is None:
                continue
            ratio, old_ratio = m.ratio, old.get("ratio")
            t.add_row(
                r.name,
                m.metric,
                fmt(old["median"]) if old.get("median") is not None else "-",
                fmt(m.median),
                m.unit,
                f"{old_ratio:.2f}" if isinstance(old_ratio, int | float) else "-",
                "-" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}",
            )
    console.print(t)
