"""One measurement of ``Ledger.execute`` in a process of its own, for ``tests.bench.sdk_compare``.

Run as a script (``python tests/bench/sdk_probe.py MODE DURABILITY N FILE``), never as a module: the
comparison points ``PYTHONPATH`` at another build of ``effect_ledger`` (today's main, say), and a
script's folder holds no ``effect_ledger`` to shadow it. Uses only the API both builds share.
Prints one JSON line: wall and CPU (all threads) microseconds per effect, effects/s, and how
many effects ended CONFIRMED. A fifth argument ``--no-sql`` runs this tree with the store's SQL
replaced by nothing (``_without_sql``): the Python side alone.
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


def _without_sql() -> None:
    """Replace the store's write transaction by one that runs no SQL and reports every write as
    committed: what is left is the ledger's Python alone (the raw limit the SQL is measured
    against). This tree's store only (``Store._write_batch``)."""
    from effect_ledger.streams.store import Store

    Store._write_batch = lambda self, ops: [1 for _ in ops]  # type: ignore[method-assign]


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
    if NO_SQL:
        confirmed = n + 100  # nothing was written: there is nothing to count
    else:
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


NO_SQL = False

if __name__ == "__main__":
    mode, durability, n, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if sys.argv[5:] == ["--no-sql"]:
        NO_SQL = True
        _without_sql()
    print(json.dumps(asyncio.run(main(mode, durability, n, path))))
