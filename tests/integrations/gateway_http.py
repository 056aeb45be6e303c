"""A synchronous refund call to the fake gateway (``effect_ledger.demo.gateway``), as a
LangGraph node or a DBOS step would make it, and the helpers the crash tests share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from effect_ledger.demo.client import GatewayUnavailable, RefundRejected

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 120.0  # a child that has not finished by then is a failed test, not a hang


def post_refund(gateway: str, order: str, amount: int, idempotency_key: str) -> dict[str, Any]:
    body = json.dumps({"order": order, "amount": amount, "currency": "CNY"}).encode()
    req = urllib.request.Request(
        f"{gateway}/refunds",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as e:
        if 400 <= e.code < 500:
            raise RefundRejected(f"{e.code}: {e.read().decode(errors='replace')}") from None
        raise GatewayUnavailable(f"{e.code}") from None


def run_child(module: str, args: list[str], crash: str | None = None, python: str = sys.executable) -> tuple[int, Any]:
    """Run ``python -m module args`` (with ``EFFECT_LEDGER_CRASH=crash``); (exit code, its JSON line)."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECT_LEDGER_CRASH"}
    if crash:
        env["EFFECT_LEDGER_CRASH"] = crash
    p = subprocess.run(
        [python, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode >= 0 and not lines:
        raise AssertionError(f"{module} exited {p.returncode} without a result:\n{p.stdout}\n{p.stderr}")
    return p.returncode, (json.loads(lines[-1]) if lines else None)
