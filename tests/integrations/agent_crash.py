"""The crash scenario of issue 38, shared by the agent-framework tests (OpenAI Agents SDK, Pydantic AI):
an app (``tests/integrations/<framework>/app.py``) runs a real agent whose fake model always calls the
refund tool; it is SIGKILLed right after the gateway committed the refund, before the framework
recorded the tool's result, then run again the way that framework goes on.

Each app takes ``--workdir --gateway --kind --run [--plain] start|resume|decide [ANSWER]`` and prints
one JSON line: ``output`` (the final answer), ``asked`` (the escalation waiting for a person) and
``refunds`` (what the tool returned to the model in this process).

``EFFECT_LEDGER_TRIALS`` sets how many trials each side runs (3 in ``make test``; ``make
test-agent-trials`` runs 20).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effect_ledger import SyncLedger
from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import run_child

TRIALS = int(os.environ.get("EFFECT_LEDGER_TRIALS", "3"))
# Four child processes per trial pair, each importing its framework (a few seconds): the test's own
# bound grows with the trials instead of pytest's default 300 s.
TRIAL_TIMEOUT_S = 120 + 40 * TRIALS


@dataclass
class AgentApp:
    module: str
    run: str

    def __call__(
        self, gw: Gateway, workdir: Path, action: str, *extra: str, plain: bool = False, crash: str | None = None
    ) -> tuple[int, Any]:
        args = ["--workdir", str(workdir), "--gateway", gw.url, "--kind", gw.state.kind, "--run", self.run]
        return run_child(self.module, [*args, *(["--plain"] if plain else []), action, *extra], crash=crash)

    def effect(self, workdir: Path, key: str) -> Any:
        with SyncLedger.open(str(workdir / "effects.db"), targets=str(workdir / "targets.toml")) as ledger:
            return ledger.get(key)


@dataclass
class Trials:
    runs: int = 0
    duplicates: int = 0  # trials whose gateway holds more than one refund for the order
    completed_with_receipt: int = 0  # the resumed run ended with the gateway's own refund id


def crash_trials(app: AgentApp, kind: str, *, plain: bool, trials: int = TRIALS) -> Trials:
    """Kill the app after the gateway committed, resume it; ``trials`` times, each on fresh files."""
    out = Trials()
    with Gateway(kind) as gw:
        for _ in range(trials):
            gw.state.reset()
            with tempfile.TemporaryDirectory() as d:
                code, _ = app(gw, Path(d), "start", plain=plain, crash=crashpoints.AFTER_CALL)
                assert code == -signal.SIGKILL, "the app was not killed at the crash point"
                code, result = app(gw, Path(d), "resume", plain=plain)
                assert code == 0, result
            refunds = gw.refunds()
            assert refunds, "the killed app never reached the gateway"
            out.runs += 1
            out.duplicates += len(refunds) > 1
            if result["output"] and any(r.id in result["output"] for r in refunds[:1]):
                out.completed_with_receipt += 1
    return out


def report(framework: str, with_ledger: Trials, plain: Trials) -> None:
    """One line per run of the trials, for the README's table (pytest shows it with -s or -rA)."""
    sys.stdout.write(
        f"\n{framework}: with effect-ledger {with_ledger.duplicates}/{with_ledger.runs} duplicated "
        f"({with_ledger.completed_with_receipt}/{with_ledger.runs} completed with the gateway's receipt); "
        f"plain tool {plain.duplicates}/{plain.runs} duplicated\n"
    )
