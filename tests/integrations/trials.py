"""The crash trials the framework adapters share: a child SIGKILLed right after the gateway committed
the refund, then restarted the way its framework resumes; the refunds at the gateway are counted.

``EFFECT_LEDGER_TRIALS`` sets how many trials each test runs (3 in ``make test``; ``make
test-agent-trials`` runs 20 and prints the counts)."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints

TRIALS = int(os.environ.get("EFFECT_LEDGER_TRIALS", "3"))
#: ``app(gateway, workdir, action, crash) -> (exit code, JSON line)``
App = Callable[[Gateway, Path, str, "str | None"], tuple[int, Any]]


def crash_trials(app: App, kind: str, trials: int = TRIALS) -> list[tuple[int, Any]]:
    """Run ``trials`` crash-and-resume trials; per trial, the refunds the gateway made and the resumed
    run's output. Each trial has its own gateway and files."""
    results = []
    for _ in range(trials):
        with Gateway(kind) as gw, tempfile.TemporaryDirectory() as d:
            code, _ = app(gw, Path(d), "start", crashpoints.AFTER_CALL)
            assert code == -signal.SIGKILL, f"the child was not killed after the call (exit {code})"
            assert len(gw.refunds()) == 1  # the destination committed before the kill
            code, out = app(gw, Path(d), "resume", None)
            assert code == 0, out
            results.append((len(gw.refunds()), out))
    return results


def report(framework: str, adapter: bool, made: list[int]) -> None:
    """One line per test for the run's log: how many trials ended with a second refund."""
    dup = sum(1 for n in made if n > 1)
    print(f"\n{framework} {'with' if adapter else 'without'} effect-ledger: {dup}/{len(made)} trials refunded twice")
