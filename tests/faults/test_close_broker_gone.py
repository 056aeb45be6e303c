"""A program with a Kafka-mode ledger whose broker is unreachable exits as soon as it closes the
ledger. It used to wait 30 s more: the relay's first step, publishing the writer schemas to
effects.schemas, waited for a broker in a thread of the loop's executor whatever ``close`` said,
and ``asyncio.run`` waits for those threads before it returns."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]
#: Far below the 30 s the schemas' wait took, far above what closing takes (0.2 s here).
BOUND_S = 10.0

_PROGRAM = textwrap.dedent(
    """
    import asyncio, sys
    from effect_ledger import Ledger, Target
    from effect_ledger.streams.config import KafkaConfig

    async def main():
        cfg = KafkaConfig(bootstrap=f"127.0.0.1:{sys.argv[2]}", prefix="gone.")
        async with await Ledger.open(sys.argv[1], kafka=cfg, targets=[Target("payments")]):
            await asyncio.sleep(1)  # the application works a while: its relay is waiting for the broker

    asyncio.run(main())
    print("returned")
    """
)


def test_closing_a_ledger_whose_broker_is_gone_lets_the_program_exit(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(_PROGRAM)
    dead = free_port()  # nothing listens there
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ledger.db"), str(dead)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 0 and proc.stdout.strip() == "returned", proc.stderr[-2000:]
    assert took < BOUND_S, f"the program took {took:.1f} s to exit after closing its ledger"
