"""The crash points against the built-in target kinds ``payment`` (a Stripe-shaped API) and
``ticket`` (a Jira-shaped API): a real agent process (``tests.crash.kind_agent``) is SIGKILLed at
each crash point, restarted with the same run, and whatever it left open is settled by the embedded
runner. Every cell must end with exactly one payment or ticket at the destination and a CONFIRMED
effect whose receipt is the destination's own id (``pi_...``, ``OPS-...``), found by the kind's search
where the crash left the outcome unrecorded. A destination whose search cannot answer ends
ESCALATED, never ABSENT, and nothing is sent twice.

The fakes index a new object 0.3 s after it is created and the targets declare a 1 s search lag, so
the restarted agent of ``after_call`` asks while the index may still lag, as in production.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.effect import attempt_deadline
from effect_ledger.core.model import State, Verdict
from effect_ledger.demo.fake_api import Running
from effect_ledger.demo.payment_api import payment_api
from effect_ledger.demo.ticket_api import ticket_api
from effect_ledger.sdk import crashpoints
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from tests.crash.kind_agent import TARGET, declaration

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("payment", "ticket")
INDEX_LAG_S = 0.3  # the fakes' own lag: under the declared search_lag ("1s")


@dataclass
class Outcome:
    point: str
    kind: str
    crashed: bool
    made: list[dict[str, Any]]
    state: str | None
    receipt_id: str | None
    evidence: str
    second_exit: int
    early_absent: list[int] | None = None  # ABSENT answers recorded before the call could no longer show


def _fake(kind: str) -> Running:
    return payment_api(lag_s=INDEX_LAG_S) if kind == "payment" else ticket_api(lag_s=INDEX_LAG_S)


def _agent(
    kind: str, api: str, workdir: Path, run_id: str, crash: str | None, *extra: str
) -> tuple[int, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV}
    if crash:
        env[crashpoints.ENV] = crash
    cmd = [sys.executable, "-m", "tests.crash.kind_agent", "--kind", kind, "--api", api]
    cmd += ["--workdir", str(workdir), "--run-id", run_id, *extra]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    if p.returncode not in (0, 3, 4, 5, -signal.SIGKILL):
        raise RuntimeError(f"agent failed ({p.returncode}): {p.stderr[-3000:]}")
    lines = p.stdout.strip().splitlines()
    return p.returncode, (json.loads(lines[-1]) if lines else {})


async def _settle(
    workdir: Path, kind: str, api: str, backoff: str = ""
) -> tuple[str | None, str | None, str, list[int]]:
    """Run the embedded runner over what the agent left, until the effect is no longer open."""
    db = workdir / "effects.db"
    if not db.exists():
        return None, None, "", []
    targets = workdir / "settle.toml"
    targets.write_text(declaration(kind, api, "1s", backoff))
    async with await Ledger.open(str(db), targets=str(targets)) as ledger:
        rows = await ledger.store.query("SELECT effect_id FROM effects")
        if not rows:
            return None, None, "", []
        key = rows[0]["effect_id"]
        runner = Runner(ledger, interval=0.05, grace_ms=0)
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        effect = await ledger.get(key)
        open_states = (State.PENDING, State.EXECUTED, State.UNCERTAIN)
        while effect is not None and effect.state in open_states and loop.time() < end:
            await runner.tick()
            effect = await ledger.get(key)
            await asyncio.sleep(0.05)
        assert effect is not None
        evidence = "; ".join(f"{r.reconciler}:{r.verdict.value}:{r.reason}" for r in effect.resolutions)
        receipt = effect.receipt.receipt_id if effect.receipt is not None else None
        # How early each ABSENT came (ms; negative is early) against the attempt's deadline plus the
        # target's lands_within (which holds the declared search lag), all on the log's time.
        lands_ms = ledger.target(TARGET[kind]).lands_within_ms
        margins = [
            effect.log_time(r) - ((attempt_deadline(effect, r.attempt) or 0) + lands_ms)
            for r in effect.resolutions
            if r.verdict == Verdict.ABSENT
        ]
        return effect.state.value, receipt, evidence, margins


def _cell(point: str, kind: str) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="el-kind-") as tmp, _fake(kind) as srv:
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        code, _ = _agent(kind, srv.url, Path(tmp), run_id, point)
        second, _ = _agent(kind, srv.url, Path(tmp), run_id, None)
        state, receipt, evidence, margins = asyncio.run(_settle(Path(tmp), kind, srv.url))
        made = srv.app.made()
        return Outcome(point, kind, code == -signal.SIGKILL, made, state, receipt, evidence, second, margins)


@pytest.fixture(scope="module")
def outcomes() -> list[Outcome]:
    jobs = [(p, k) for p in crashpoints.POINTS for k in KINDS]
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda job: _cell(*job), jobs))


def test_every_crash_point_killed_the_agent(outcomes: list[Outcome]) -> None:
    assert len(outcomes) == len(crashpoints.POINTS) * len(KINDS)
    assert [(o.point, o.kind) for o in outcomes if not o.crashed] == []


def test_exactly_one_payment_or_ticket_and_confirmed_with_its_id(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        assert len(o.made) == 1, f"{o.point}/{o.kind}: {len(o.made)} made at the destination"
        own_id = o.made[0]["id"] if o.kind == "payment" else o.made[0]["key"]
        assert (o.state, o.receipt_id) == ("CONFIRMED", own_id), f"{o.point}/{o.kind}: {o}"
        assert o.second_exit == 0, f"{o.point}/{o.kind}: the restarted agent did not confirm ({o.second_exit})"


def test_an_unrecorded_outcome_was_found_by_the_kinds_search(outcomes: list[Outcome]) -> None:
    """after_call: the destination committed and nothing was recorded; only the search can know."""
    for o in outcomes:
        if o.point == crashpoints.AFTER_CALL:
            assert f"{o.kind}:{TARGET[o.kind]}:FOUND" in o.evidence, f"{o.kind}: {o.evidence}"
            placed = (
                o.made[0]["metadata"]["effect_key"] if o.kind == "payment" else o.made[0]["fields"]["customfield_10050"]
            )
            assert placed.startswith(f"{TARGET[o.kind]}:"), o.made[0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_destination_that_cannot_answer_ends_escalated_never_absent(kind: str) -> None:
    """The call committed, the agent died, and every search since fails (HTTP 500, a redirect, a
    shape it does not know): after the declared tries the effect is ESCALATED, the restarted agent
    sends nothing, and there is still exactly one payment or ticket."""
    backoff = '{ first = "50ms", factor = 1, tries = 3 }'
    with tempfile.TemporaryDirectory(prefix="el-kind-") as tmp, _fake(kind) as srv:
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        code, _ = _agent(kind, srv.url, Path(tmp), run_id, crashpoints.AFTER_CALL, "--backoff", backoff)
        assert code == -signal.SIGKILL
        for mode in ("error", "redirect", "shape", "wrong-page", "html"):
            _admin(srv.url, "/_admin/fail", {"on": "search", "mode": mode, "count": 20})
        second, out = _agent(kind, srv.url, Path(tmp), run_id, None, "--backoff", backoff)
        assert second == 3, out  # uncertain: the run holds, nothing is sent
        state, receipt, evidence, _ = asyncio.run(_settle(Path(tmp), kind, srv.url, backoff))
        assert state == "ESCALATED" and receipt is None, (state, evidence)
        assert "ABSENT" not in evidence and "FOUND" not in evidence, evidence
        assert len(srv.app.made()) == 1


def _admin(url: str, path: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


def test_absence_was_proven_only_once_the_index_could_show_the_call(outcomes: list[Outcome]) -> None:
    """after_intent: nothing was sent, and the restart found nothing. ABSENT (which let it execute)
    was recorded only after the attempt's deadline plus lands_within plus the declared search lag:
    before that an empty search proves nothing (an "absent so far" hold, when the restart asked early)."""
    for o in outcomes:
        if o.point == crashpoints.AFTER_INTENT:
            assert o.early_absent, f"{o.kind}: no ABSENT was recorded: {o.evidence}"
            assert all(margin >= 0 for margin in o.early_absent), f"{o.kind}: {o.early_absent} {o.evidence}"
            assert "absent so far" not in o.evidence or o.evidence.index("absent so far") < o.evidence.index(":ABSENT:")
