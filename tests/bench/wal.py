"""wal_bound: one ledger file written at full speed (64 concurrent tasks, NORMAL), its WAL and
database sizes followed throughout, and the cost per effect at the start and at the end.

``make bench`` writes ``EFFECTS_BENCH_WAL_EFFECTS`` effects (default 100,000; 25,000 with
``--quick``); set it to 1000000 for the full row (32 minutes on a busy 2-core machine, a 1.9 GB
file). Standalone: ``python -m tests.bench.wal [EFFECTS]``.

Figures: the peak size of the ``-wal`` file (sampled by every task every 16 effects, and after
the run), the database's size at the end (before close), and the median cost (wall microseconds
per effect) of the first and of the last window of ``WINDOW`` effects: their ratio is how much
dearer an effect became as the file grew.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from effect_ledger.core.reconcile import Target
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.store.sqlite import WAL_LIMIT_BYTES
from tests.bench.common import BenchResult, Context, Metric, disk_info

CONCURRENCY = 64
WINDOW = 50_000
PEAK_WAL_TARGET_MB = 64.0
GROWTH_TARGET = 1.2  # cost per effect at the end / at the start, at most
REQUEST = {"order": "123", "amount": 4800, "currency": "CNY"}


async def _call(key: str) -> dict[str, Any]:
    return {"id": "re_" + key[-12:]}


async def write(path: Path, n: int, progress: Any = None) -> dict[str, float]:
    """Write ``n`` effects into ``path``; returns the figures (sizes in MB, costs in us/effect)."""
    wal = path.with_name(path.name + "-wal")
    ledger = await Ledger.open(str(path), targets=[Target("payments")])
    run = uuid.uuid4().hex
    done = 0
    peak = 0
    stamps: list[float] = []  # time at every 1,000th effect
    window = min(WINDOW, max(1_000, n // 4))

    def sample() -> None:
        nonlocal peak
        try:
            peak = max(peak, os.stat(wal).st_size)
        except OSError:
            pass

    async def worker(w: int) -> None:
        nonlocal done
        i = w
        while i < n:
            await ledger.execute(
                target="payments", operation="refund.create", run_id=run, step=f"r-{i}", request=REQUEST, call=_call
            )
            i += CONCURRENCY
            done += 1
            if done % 16 == 0:
                sample()
            if done % 1_000 == 0:
                stamps.append(time.perf_counter())
                if progress is not None and done % 50_000 == 0:
                    progress(f"wal: {done:,} effects, WAL now {os.stat(wal).st_size / 2**20:.1f} MB, peak "
                             f"{peak / 2**20:.1f} MB, database {path.stat().st_size / 2**20:,.0f} MB")  # fmt: skip

    t0 = time.perf_counter()
    stamps.append(t0)
    try:
        await asyncio.gather(*(worker(w) for w in range(CONCURRENCY)))
        sample()
        db_mb = path.stat().st_size / 2**20
    finally:
        await ledger.close()
    elapsed = time.perf_counter() - t0
    per_k = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]  # us/effect per 1,000
    k = max(1, window // 1_000)
    return {
        "effects": n,
        "seconds": elapsed,
        "peak_wal_mb": peak / 2**20,
        "db_mb_at_end": db_mb,
        "us_per_effect_start": statistics.median(per_k[:k]),
        "us_per_effect_end": statistics.median(per_k[-k:]),
        "window": window,
    }


def _effects(ctx: Context | None) -> int:
    env = os.environ.get("EFFECTS_BENCH_WAL_EFFECTS")
    if env:
        return int(env)
    return 25_000 if ctx is not None and ctx.quick else 100_000


def run(ctx: Context) -> BenchResult:
    wd = ctx.workdir("wal")
    n = _effects(ctx)
    res = BenchResult("wal_bound", "ran", info={"disk": disk_info(wd), "concurrency": CONCURRENCY,
                                                "wal_limit_mb": WAL_LIMIT_BYTES / 2**20})  # fmt: skip
    r = asyncio.run(write(wd / "wal.db", n, ctx.progress))
    growth = r["us_per_effect_end"] / r["us_per_effect_start"]
    ctx.progress(f"wal: {n:,} effects in {r['seconds']:.0f} s; peak WAL {r['peak_wal_mb']:.1f} MB, database "
                 f"{r['db_mb_at_end']:,.0f} MB; {r['us_per_effect_start']:.0f} -> {r['us_per_effect_end']:.0f} "
                 f"us/effect ({growth:.2f}x)")  # fmt: skip
    res.metrics += [
        Metric(f"peak WAL, {n:,} effects", "MB", [r["peak_wal_mb"]], higher_is_better=False,
               target=PEAK_WAL_TARGET_MB, extra={"db_mb_at_end": r["db_mb_at_end"]}),
        Metric(f"cost growth, last/first {r['window']:,}", "x", [growth], higher_is_better=False,
               target=GROWTH_TARGET, extra={k: r[k] for k in ("us_per_effect_start", "us_per_effect_end")}),
    ]  # fmt: skip
    return res


if __name__ == "__main__":
    import tempfile

    count = int(sys.argv[1]) if len(sys.argv) > 1 else _effects(None)
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        print(asyncio.run(write(Path(tmp) / "wal.db", count, print)))
