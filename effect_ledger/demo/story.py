"""``effects demo``: the refund story, told with real processes and a real HTTP gateway.

1. Without the ledger: an agent refunds 4,800, is killed (SIGKILL) right after the gateway
   committed, restarts from its checkpoint and refunds again: two refunds.
2. With effect-ledger: the same crash. The intent was durable before the call; at its deadline
   the effect turns UNCERTAIN; the reconciler asks the gateway by idempotency key, finds the
   refund and confirms it; the restarted agent gets the original receipt without calling again.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from effect_ledger.core.effect import apply
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Event, Executed, Intent, Receipt, Resolution, State, Timeout
from effect_ledger.demo.agent import write_declaration
from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from effect_ledger.targets.load import load_targets

SETTLED = (State.CONFIRMED, State.ESCALATED, State.ABSENT, State.FAILED)


def _agent(
    mode: str, workdir: Path, url: str, crash: str | None, timeout: float, extra: list[str] | None = None
) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ)
    env.pop(crashpoints.ENV, None)
    if crash:
        env[crashpoints.ENV] = crash
    cmd = [
        sys.executable,
        "-m",
        "effect_ledger.demo.agent",
        "--mode",
        mode,
        "--workdir",
        str(workdir),
        "--gateway",
        url,
        "--timeout",
        str(timeout),
        *(extra or []),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout.strip().splitlines()
    if proc.returncode not in (0, -signal.SIGKILL) and not out:
        raise RuntimeError(f"agent failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.returncode, (json.loads(out[-1]) if out else {})


def _exit_text(code: int) -> str:
    return "killed by SIGKILL" if code == -signal.SIGKILL else f"exit {code}"


def _describe(event: Event) -> str:
    if isinstance(event, Intent):
        return f"intent (attempt {event.attempt}, deadline +{(event.deadline_ms - event.at_ms) / 1000:.0f} s)"
    if isinstance(event, Executed):
        return f"executed: {event.outcome.value}"
    if isinstance(event, Receipt):
        return f"receipt {event.receipt_id} from the {event.source.value.lower()}"
    if isinstance(event, Timeout):
        return "deadline passed without an outcome"
    if isinstance(event, Resolution):
        found = f" {event.receipt_id}" if event.receipt_id else ""
        return f"{event.reconciler}: {event.verdict.value}{found}"
    return type(event).__name__


async def _settle(console: Console, db: Path, targets: Path, timeout_s: float) -> tuple[list[str], str]:
    """Run the embedded runner on the agent's ledger file until the effect is settled, then show its
    recorded history. Returns the states it went through and the key."""
    async with await Ledger.open(str(db), targets=load_targets(targets)) as ledger:
        runner = Runner(ledger, interval=0.1, grace_ms=200)
        rows = await ledger.store.query("SELECT effect_id, state FROM effects")
        key = rows[0]["effect_id"]
        console.print(
            f"   ledger: the effect is [yellow]{rows[0]['state']}[/]: intent durable, outcome never "
            "recorded. The runner waits for its deadline, then asks the gateway by key."
        )
        end = time.monotonic() + timeout_s
        effect = await ledger.get(key)
        while time.monotonic() < end and effect is not None and effect.state not in SETTLED:
            await runner.tick()
            effect = await ledger.get(key)
            await asyncio.sleep(0.05)
        history = await ledger.store.events(key)
    table = Table(title=f"effects.db: the record of effect {key[:20]}…", title_justify="left")
    table.add_column("t", justify="right")
    table.add_column("event")
    table.add_column("state after")
    states: list[str] = []
    folded = None
    t0 = history[0][1].at_ms if history else 0
    for _, event, _ in history:
        folded, _ = apply(folded, event)
        if not states or states[-1] != folded.state.value:
            states.append(folded.state.value)
        table.add_row(f"+{(event.at_ms - t0) / 1000:.1f} s", _describe(event), folded.state.value)
    console.print(table)
    return states, key


DEMO_DB = "effects-demo.db"  # where `effects demo` leaves its ledger: the current folder


def demo_key() -> str:
    """The one effect the demo's agent records (its default order and run, ``demo/agent.py``)."""
    return effect_key("payments", "refund.create", "run-1", "refund-order-123")


def check_keep(dest: Path) -> None:
    """Refuse, before anything runs, a place the demo may not leave its ledger: a missing folder, or a
    file there that is not an earlier demo's ledger (a ledger holding the demo's one effect and
    nothing else). Such a file is never modified."""
    from effect_ledger.errors import StorageError
    from effect_ledger.sdk.store.reader import read_only_uri

    if not dest.parent.is_dir():
        raise StorageError(f"{dest}: no folder {dest.parent} to leave the demo's ledger in")
    if not os.path.lexists(dest):
        return
    mine = f"{dest} is there and is not an earlier demo's ledger: effects demo replaces only its own file"
    if dest.is_symlink() or not dest.is_file():
        raise StorageError(mine)
    try:
        conn = sqlite3.connect(read_only_uri(dest), uri=True)
        try:
            keys = {row[0] for row in conn.execute("SELECT DISTINCT effect_id FROM events")}
        finally:
            conn.close()
    except sqlite3.Error:
        raise StorageError(mine) from None
    if keys != {demo_key()}:
        raise StorageError(mine)


def keep_ledger(source: Path, dest: Path) -> None:
    """Copy the demo's ledger file to ``dest`` whole or not at all: SQLite's online backup into a
    temporary file beside it, then one rename over a previous demo's file. The copy uses a rollback
    journal, and a previous file's ``-wal``/``-shm`` are removed first, so no stale write-ahead log
    can be applied to the new file."""
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.unlink(missing_ok=True)
    src = sqlite3.connect(source)
    try:
        out = sqlite3.connect(tmp)
        try:
            src.backup(out)
            out.execute("PRAGMA journal_mode=DELETE")
        finally:
            out.close()
    finally:
        src.close()
    for suffix in ("-wal", "-shm"):
        dest.with_name(dest.name + suffix).unlink(missing_ok=True)
    os.replace(tmp, dest)


def program(path_env: str | None = None, cwd: str | None = None) -> str:
    """How a shell in ``cwd`` reaches the ``effects`` running now: ``effects`` when the PATH finds this
    very script, else its path (``.venv/bin/effects`` after ``make demo``: a fresh shell has no
    activated environment, and a bare ``effects`` would not be found, or be another install's)."""
    import shutil

    argv0 = sys.argv[0] if sys.argv and Path(sys.argv[0]).name == "effects" else ""
    running = Path(argv0) if argv0 and Path(argv0).is_file() else Path(sys.executable).with_name("effects")
    running = running.absolute()
    found = shutil.which("effects", path=path_env if path_env is not None else os.environ.get("PATH"))
    try:
        if found is not None and os.path.samefile(found, running):
            return "effects"
    except OSError:  # a PATH entry that vanished: not the running script
        pass
    here = Path(cwd or os.getcwd()).absolute()
    shown = running.relative_to(here) if running.is_relative_to(here) else running
    return shlex.quote(str(shown) if shown.is_absolute() or "/" in str(shown) else f"./{shown}")


def next_steps(db: str, key: str, since_ms: int, effects: str = "effects") -> list[str]:
    """The three commands that open what the demo recorded, as a shell takes them (``effects``: how
    the shell reaches the program, see :func:`program`)."""
    from effect_ledger.core.timeparse import iso

    q = shlex.quote
    return [
        f"{effects} trace {q(key)} --db {q(db)}",
        f"{effects} console --db {q(db)}",
        f"{effects} audit --db {q(db)} --from {q(iso(since_ms))}",
    ]


def run_demo(console: Console | None = None, timeout: float = 2.0, keep: str = DEMO_DB) -> int:
    console = console or Console(highlight=False)
    started = time.monotonic()
    check_keep(Path(keep))
    # The window of the audit printed at the end: from a second before the first intent.
    since_ms = time.time_ns() // 1_000_000 - 1000
    console.rule("[bold]effect-ledger demo: a refund, a crash, a restart")
    console.print(
        "An agent refunds order 123 (4,800 CNY) at a payment gateway. Its process is killed "
        "with SIGKILL right after the gateway committed the refund, before anything was recorded.\n"
    )
    with tempfile.TemporaryDirectory(prefix="effect-ledger-demo-") as tmp, Gateway("key+lookup") as gw:
        console.print(f"Gateway on {gw.url}: honours Idempotency-Key, answers GET /refunds/by-key/{{key}}.\n")

        console.print("[bold]1. Without the ledger[/] (checkpoint after the call, a fresh key per attempt)")
        naive = Path(tmp, "naive")
        naive.mkdir()
        code, _ = _agent("naive", naive, gw.url, crashpoints.AFTER_CALL, timeout)
        console.print(f"   agent: refund sent ... {_exit_text(code)} at [bold]after_call[/]")
        code, out = _agent("naive", naive, gw.url, None, timeout)
        console.print(
            f"   agent restarted: its checkpoint says the step never finished, so it refunds "
            f"again ({out.get('receipt_id')})"
        )
        naive_refunds = gw.refunds()
        console.print(
            f"   gateway: [red bold]{len(naive_refunds)} refunds[/] of 4,800 for order 123: "
            f"{', '.join(r.id for r in naive_refunds)}\n"
        )

        gw.state.reset()
        console.print("[bold]2. With effect-ledger[/] (same crash)")
        led = Path(tmp, "ledger")
        led.mkdir()
        # One declaration of the gateway, read by the agent and by the runner alike.
        targets = write_declaration(Path(tmp, "targets.toml"), gw.url, "key+lookup")
        declared = ["--targets", str(targets)]
        code, _ = _agent("ledger", led, gw.url, crashpoints.AFTER_CALL, timeout, declared)
        console.print(
            f"   agent: intent written to effects.db, refund sent with its key ... "
            f"{_exit_text(code)} at [bold]after_call[/]"
        )
        states, key = asyncio.run(_settle(console, led / "effects.db", targets, timeout + 20))
        code, out = _agent("ledger", led, gw.url, None, timeout, declared)
        called = "called the gateway again" if out.get("called") else "did not call the gateway"
        console.print(
            f"   agent restarted: the ledger returns receipt [bold]{out.get('receipt_id')}[/] "
            f"({out.get('source', '').lower()}); it {called}"
        )
        ledger_refunds = gw.refunds()
        console.print(
            f"   gateway: [green bold]{len(ledger_refunds)} refund[/]: {', '.join(r.id for r in ledger_refunds)}\n"
        )

        table = Table(title="What the gateway paid for one logical refund")
        table.add_column("run")
        table.add_column("refunds at the gateway", justify="right")
        table.add_column("paid", justify="right")
        table.add_column("effect states")
        table.add_row("naive retry", str(len(naive_refunds)), f"{sum(r.amount for r in naive_refunds):,}", "-")
        table.add_row(
            "effect-ledger", str(len(ledger_refunds)), f"{sum(r.amount for r in ledger_refunds):,}", " -> ".join(states)
        )
        console.print(table)
        ok = (
            len(naive_refunds) == 2
            and len(ledger_refunds) == 1
            and out.get("result") == "confirmed"
            and not out.get("called")
            and states[-1] == State.CONFIRMED.value
        )
        elapsed = time.monotonic() - started
        if ok:
            console.print(f"[green]One refund, recorded, reconciled, returned on restart.[/] ({elapsed:.1f} s)")
            keep_ledger(led / "effects.db", Path(keep))
            trace, serve, audit = next_steps(keep, key, since_ms, program())
            console.print(f"\nThe ledger is left in [bold]{keep}[/]. Three things to try on it:")
            console.print(f"  {trace}", soft_wrap=True)
            console.print("      the effect's timeline: intent, deadline, the gateway's answer", soft_wrap=True)
            console.print(f"  {serve}", soft_wrap=True)
            console.print("      the web console on http://127.0.0.1:8080/ (Ctrl-C stops it)", soft_wrap=True)
            console.print(f"  {audit}", soft_wrap=True)
            console.print("      the checks over the demo's window: every one passes", soft_wrap=True)
            return 0
        console.print(
            f"[red]The demo did not go as told[/]: naive={len(naive_refunds)}, "
            f"ledger={len(ledger_refunds)}, agent={out}, states={states}"
        )
        return 1
