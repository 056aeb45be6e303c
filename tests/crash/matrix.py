"""The crash matrix: every crash point x every kind of destination, with real child processes
killed by SIGKILL, for the naive retry and for effect-ledger.

    python -m tests.crash.matrix --runs 3      # prints the table (README, closing notes)

A cell counts, over its runs: refunds made beyond the first (duplicates), and effects lost — an
effect that did not end CONFIRMED, FAILED or ESCALATED-with-evidence, or whose end state
contradicts the gateway (CONFIRMED with no refund there, FAILED/ABSENT with one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from processors.demo.agent import payments_target
from processors.demo.gateway import KINDS, Gateway
from processors.runner import Runner
from streams import crashpoints
from streams.ledger import Ledger
from streams.model import State

CALL_TIMEOUT = 1.0  # the agent's call deadline: short, so after_intent cells wait little


@dataclass
class Run:
    crashed: bool
    refunds: int
    state: str | None
    lost: bool
    evidence: str = ""


@dataclass
class Cell:
    point: str
    kind: str
    naive: list[Run] = field(default_factory=list)
    ledger: list[Run] = field(default_factory=list)

    @staticmethod
    def duplicates(runs: list[Run]) -> int:
        return sum(max(0, r.refunds - 1) for r in runs)

    @staticmethod
    def lost(runs: list[Run]) -> int:
        return sum(r.lost for r in runs)


def _agent(mode: str, workdir: Path, url: str, kind: str, crash: str | None) -> tuple[int, dict[str, object]]:
    env = dict(os.environ)
    env.pop(crashpoints.ENV, None)
    if crash:
        env[crashpoints.ENV] = crash
    cmd = [
        sys.executable,
        "-m",
        "processors.demo.agent",
        "--mode",
        mode,
        "--workdir",
        str(workdir),
        "--gateway",
        url,
        "--kind",
        kind,
        "--timeout",
        str(CALL_TIMEOUT),
        "--patience",
        "30",
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    lines = p.stdout.strip().splitlines()
    if p.returncode not in (0, 3, 4, 5, -signal.SIGKILL):
        raise RuntimeError(f"agent {mode} crashed unexpectedly ({p.returncode}): {p.stderr[-3000:]}")
    return p.returncode, (json.loads(lines[-1]) if lines else {})


async def _final_state(db: Path, url: str, kind: str) -> tuple[str | None, str]:
    """Let the runner settle whatever the restarted agent left open, then read the effect."""
    if not db.exists():
        return None, ""
    async with await Ledger.open(str(db), targets=[payments_target(url, kind)]) as ledger:
        rows = await ledger.store.query("SELECT effect_id FROM effects")
        if not rows:
            return None, ""
        key = rows[0]["effect_id"]
        runner = Runner(ledger, interval=0.05, grace_ms=0)
        loop = asyncio.get_running_loop()
        end = loop.time() + 15
        effect = await ledger.get(key)
        while effect is not None and effect.state in (State.PENDING, State.EXECUTED) and loop.time() < end:
            await runner.tick()
            effect = await ledger.get(key)
            await asyncio.sleep(0.05)
        assert effect is not None
        evidence = "; ".join(f"{r.reconciler}:{r.verdict.value}:{r.reason}" for r in effect.resolutions)
        return effect.state.value, evidence


def run_cell(point: str, kind: str, runs: int) -> Cell:
    cell = Cell(point, kind)
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="el-crash-") as tmp, Gateway(kind) as gw:
            naive = Path(tmp, "naive")
            naive.mkdir()
            code, _ = _agent("naive", naive, gw.url, kind, point)
            _agent("naive", naive, gw.url, kind, None)
            cell.naive.append(Run(code == -signal.SIGKILL, len(gw.refunds()), None, False))

            gw.state.reset()
            led = Path(tmp, "ledger")
            led.mkdir()
            code, _ = _agent("ledger", led, gw.url, kind, point)
            _agent("ledger", led, gw.url, kind, None)
            state, evidence = asyncio.run(_final_state(led / "effects.db", gw.url, kind))
            made = len(gw.refunds())
            lost = (
                state not in (State.CONFIRMED, State.FAILED, State.ESCALATED)
                or (state == State.CONFIRMED and made == 0)
                or (state == State.FAILED and made > 0)
                or (state == State.ESCALATED and not evidence)
            )
            cell.ledger.append(Run(code == -signal.SIGKILL, made, state, lost, evidence))
    return cell


def run_matrix(runs: int, workers: int = 4) -> list[Cell]:
    jobs = [(p, k) for p in crashpoints.POINTS for k in KINDS]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: run_cell(job[0], job[1], runs), jobs))


def table(cells: list[Cell]) -> str:
    head = "| crash point | destination | runs | naive duplicates | ledger duplicates | lost | ledger end states |"
    rows = [head, "|" + "---|" * 7]
    for c in cells:
        states = ", ".join(sorted({str(r.state) for r in c.ledger}))
        rows.append(
            f"| {c.point} | {c.kind} | {len(c.ledger)} | {Cell.duplicates(c.naive)} | "
            f"{Cell.duplicates(c.ledger)} | {Cell.lost(c.ledger)} | {states} |"
        )
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.crash.matrix")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    cells = run_matrix(args.runs)
    print(table(cells))
    bad = sum(Cell.duplicates(c.ledger) + Cell.lost(c.ledger) for c in cells)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
