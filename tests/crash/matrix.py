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
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from effect_ledger.core.effect import fold
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import State
from effect_ledger.demo.agent import payments_target
from effect_ledger.demo.gateway import KINDS, Gateway
from effect_ledger.errors import LedgerUnavailable
from effect_ledger.sdk import crashpoints
from effect_ledger.sdk.kafka.lookup import ProcessorLookup
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from effect_ledger.streams.codec import default_codec

CALL_TIMEOUT = 1.0  # the agent's call deadline: short, so after_intent cells wait little
CONFIRM_WITHIN = 1.0  # Kafka mode: what the deadline adds for the confirmations (as short, likewise)


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


@dataclass(frozen=True)
class KafkaMode:
    """Run the ledger agents in Kafka mode: the restart happens on "another host" (an empty
    workdir) and learns what happened through the ledger processor at ``lookup``."""

    bootstrap: str
    prefix: str
    lookup: str

    def args(self) -> list[str]:
        return ["--kafka", self.bootstrap, "--prefix", self.prefix, "--lookup", self.lookup]


def _agent(
    mode: str,
    workdir: Path,
    url: str,
    kind: str,
    crash: str | None,
    run_id: str = "run-1",
    kafka: KafkaMode | None = None,
) -> tuple[int, dict[str, object]]:
    env = dict(os.environ)
    env.pop(crashpoints.ENV, None)
    if crash:
        env[crashpoints.ENV] = crash
    cmd = [sys.executable, "-m", "effect_ledger.demo.agent", "--mode", mode, "--workdir", str(workdir)]
    cmd += ["--gateway", url, "--kind", kind, "--timeout", str(CALL_TIMEOUT), "--patience", "30", "--run-id", run_id]
    if kafka is not None and mode != "naive":
        cmd += [*kafka.args(), "--confirm-within", str(CONFIRM_WITHIN)]
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


async def settled_kafka(kafka: KafkaMode, key: str) -> tuple[str | None, str | None, str]:
    """The effect as the ledger processor's table has it, once it is no longer open (or after 30 s):
    its state, its receipt id and the reconcilers' evidence."""
    lookup = ProcessorLookup(kafka.lookup)
    codec = default_codec()
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    effect = None
    try:
        while loop.time() < end:
            try:
                effect = fold([codec.decode(b) for b in await lookup.events(key)])
            except LedgerUnavailable:
                effect = None
            if effect is not None and effect.state not in (State.PENDING, State.EXECUTED, State.UNCERTAIN):
                break
            await asyncio.sleep(0.1)
    finally:
        await lookup.close()
    if effect is None:
        return None, None, ""
    evidence = "; ".join(f"{r.reconciler}:{r.verdict.value}:{r.reason}" for r in effect.resolutions)
    return effect.state.value, (effect.receipt.receipt_id if effect.receipt else None), evidence


def run_cell(
    point: str, kind: str, runs: int, kafka: KafkaMode | None = None, mode: str = "ledger", naive: bool = True
) -> Cell:
    """``mode``: the agent's (``ledger``: ``Ledger``; ``ledger-sync``: ``SyncLedger``, embedded;
    ``ledger-sync-inline``: the same, with the call in the caller's thread);
    ``naive``: run the naive retry beside it."""
    cell = Cell(point, kind)
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="el-crash-") as tmp, Gateway(kind) as gw:
            if naive:
                workdir = Path(tmp, "naive")
                workdir.mkdir()
                code, _ = _agent("naive", workdir, gw.url, kind, point)
                _agent("naive", workdir, gw.url, kind, None)
                cell.naive.append(Run(code == -signal.SIGKILL, len(gw.refunds()), None, False))
                gw.state.reset()

            led = Path(tmp, "ledger")
            led.mkdir()
            run_id = f"run-{uuid.uuid4().hex[:12]}"
            code, _ = _agent(mode, led, gw.url, kind, point, run_id, kafka)
            if kafka is None:
                _agent(mode, led, gw.url, kind, None, run_id)
                state, evidence = asyncio.run(_final_state(led / "effects.db", gw.url, kind))
            else:
                other_host = Path(tmp, "ledger-restarted")
                other_host.mkdir()
                _agent(mode, other_host, gw.url, kind, None, run_id, kafka)
                key = effect_key("payments", "refund.create", run_id, "refund-order-123")
                state, _, evidence = asyncio.run(settled_kafka(kafka, key))
            made = len(gw.refunds())
            lost = (
                state not in (State.CONFIRMED, State.FAILED, State.ESCALATED)
                or (state == State.CONFIRMED and made == 0)
                or (state == State.FAILED and made > 0)
                or (state == State.ESCALATED and not evidence)
            )
            cell.ledger.append(Run(code == -signal.SIGKILL, made, state, lost, evidence))
    return cell


def run_matrix(
    runs: int, workers: int = 4, kafka: KafkaMode | None = None, mode: str = "ledger", naive: bool = True
) -> list[Cell]:
    jobs = [(p, k) for p in crashpoints.POINTS for k in KINDS]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: run_cell(job[0], job[1], runs, kafka, mode, naive), jobs))


@contextlib.contextmanager
def kafka_setup() -> Iterator[KafkaMode]:
    """Fresh topics and a ledger processor for one matrix run."""
    from effect_ledger.streams.admin import delete_topics, ensure_topics, list_topics
    from effect_ledger.streams.config import KafkaConfig
    from tests.services import Processor

    cfg = KafkaConfig.from_env(prefix=f"crash{uuid.uuid4().hex[:8]}.", partitions=3)
    ensure_topics(cfg)
    with tempfile.TemporaryDirectory(prefix="el-crash-proc-") as tmp:
        proc = Processor(cfg, Path(tmp, "data")).start()
        try:
            proc.wait_ready()
            yield KafkaMode(cfg.bootstrap, cfg.prefix, proc.url)
        finally:
            proc.stop()
            delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])


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
    p.add_argument("--kafka", action="store_true", help="through a real broker (KAFKA_BOOTSTRAP) and processor")
    p.add_argument("--sync", action="store_true", help="the ledger agent through SyncLedger (embedded)")
    p.add_argument("--inline-calls", action="store_true", help="with --sync: SyncLedger's inline_calls")
    args = p.parse_args()
    if args.sync and args.kafka:
        p.error("--sync runs embedded (no --kafka)")
    if args.inline_calls and not args.sync:
        p.error("--inline-calls goes with --sync")
    if args.sync:
        cells = run_matrix(args.runs, mode="ledger-sync-inline" if args.inline_calls else "ledger-sync")
    elif not args.kafka:
        cells = run_matrix(args.runs)
    else:
        with kafka_setup() as kafka:
            cells = run_matrix(args.runs, kafka=kafka)
    print(table(cells))
    bad = sum(Cell.duplicates(c.ledger) + Cell.lost(c.ledger) for c in cells)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
