"""One measurement of ``Ledger.execute`` in a process of its own, for ``tests.bench.sdk_compare``.

Run as a script (``python tests/bench/sdk_probe.py MODE DURABILITY N FILE``), never as a module: the
comparison points ``PYTHONPATH`` at another build of ``effect_ledger`` (today's main, say), and a
script's folder holds no ``effect_ledger`` to shadow it. Uses only the API both builds share.
Prints one JSON line: wall and CPU (all threads) microseconds per effect, effects/s, and how
many effects ended CONFIRMED.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
import uuid
from typing import Any

from effect_ledger.streams.ledger import Ledger
from effect_ledger.streams.reconcile import Target

CONCURRENCY = 64
REQUEST = {"order": "123", "amount": 4800, "currency": "CNY"}


async def _call(key: str) -> dict[str, Any]:
    return {"id": "re_" + key[-12:]}


async def main(mode: str, durability: str, n: int, path: str) -> dict[str, float]:
    ledger = await Ledger.open(path, durability=durability, targets=[Target("payments")])
    run = uuid.uuid4().hex

    async def one(i: int) -> None:
        await ledger.execute(
            target="payments", operation="refund.create", run_id=run, step=f"refund-{i}", request=REQUEST, call=_call
        )

    try:
        for i in range(100):  # warm-up
            await one(-1 - i)
        c0 = time.process_time()
        t0 = time.perf_counter()
        if mode == "sequential":
            for i in range(n):
                await one(i)
        else:
            per = max(1, n // CONCURRENCY)

            async def worker(w: int) -> None:
                for j in range(per):
                    await one(w * per + j)

            await asyncio.gather(*(worker(w) for w in range(CONCURRENCY)))
            n = per * CONCURRENCY
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
    finally:
        await ledger.close()
    conn = sqlite3.connect(path)
    confirmed = conn.execute("SELECT count(*) FROM effects WHERE state = 'CONFIRMED'").fetchone()[0]
    conn.close()
    return {
        "us_per_effect": elapsed / n * 1e6,
        "cpu_us_per_effect": cpu / n * 1e6,
        "effects_per_s": n / elapsed,
        "confirmed": confirmed - 100,
        "n": n,
    }


if __name__ == "__main__":
    mode, durability, n, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    print(json.dumps(asyncio.run(main(mode, durability, n, path))))
