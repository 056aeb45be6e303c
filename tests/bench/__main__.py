"""``python -m tests.bench``: run the benchmarks, print the table, write the JSON results."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from effect_ledger.streams.admin import BrokerUnavailable, wait_ready
from effect_ledger.streams.config import KafkaConfig
from tests.bench import assess, audit, claims, detection, processor, relay, sdk, sdk_peers, wal
from tests.bench.common import CPU_COUNT, ROOT, BenchResult, Context, Skip, disk_info
from tests.bench.report import print_comparison, print_table, read_previous, write_json

# name -> (function, needs the broker). In the order of the issue; memory reads the processor's
# measured rate (to size its fill), so it runs after processor_throughput.
BENCHMARKS: dict[str, tuple[Callable[[Context], BenchResult], bool]] = {
    "sdk_overhead_embedded": (sdk.run, False),
    "sdk_peers": (sdk_peers.run, False),
    "wal_bound": (wal.run, False),
    "relay_throughput": (relay.run, True),
    "processor_throughput": (processor.run_throughput, True),
    "detection_latency": (detection.run, True),
    "audit_replay": (audit.run, True),
    "memory": (processor.run_memory, True),
    "claims": (claims.run, True),
    "takeover": (processor.run_takeover, True),
    "assess_speed": (assess.run, False),
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="2 repetitions and smaller sizes (about 3 minutes)")
    p.add_argument("--only", nargs="+", choices=list(BENCHMARKS), metavar="NAME", help="run only these benchmarks")
    p.add_argument("--json", default="bench-results.json", help="where to write the results [bench-results.json]")
    p.add_argument("--reps", type=int, default=None, help="repetitions per figure [5; --quick: 2]")
    p.add_argument(
        "--partitions", type=int, default=int(os.environ.get("EFFECTS_PARTITIONS", "6")),
        help="partitions of the bench topics [EFFECTS_PARTITIONS or 6]",
    )  # fmt: skip
    p.add_argument("--plots", default=None,
                   help="folder of the PNGs (memory: RSS against effects) [next to --json]")  # fmt: skip
    p.add_argument("--memory-effects", type=int, default=None,
                   help="memory: effects to fold [1,000,000; --quick: 100,000]")  # fmt: skip
    p.add_argument("--memory-budget", type=float, default=None,
                   help="memory: seconds of folding at most, 0 for no limit [90; --quick: 20]")  # fmt: skip
    p.add_argument("--detection-rates", default=None,
                   help="detection_latency: background effects/s under load, comma-separated [1000]")  # fmt: skip
    p.add_argument("--detection-seconds", type=float, default=None,
                   help="detection_latency: seconds of sustained load per rate [40; --quick: 10]")  # fmt: skip
    return p.parse_args(argv)


def _git() -> dict[str, Any]:
    """The commit measured, and whether product code differs from it."""

    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "HEAD"),
            "product_code_modified": bool(git("status", "--porcelain", "streams", "processors", "schemas")),
        }
    except (OSError, subprocess.SubprocessError):
        return {}


def _sigterm(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    bootstrap = KafkaConfig.from_env().bootstrap
    names = args.only or list(BENCHMARKS)
    ctx = Context(
        quick=args.quick, reps=args.reps, bootstrap=bootstrap, partitions=args.partitions,
        printer=lambda msg: console.print(msg, markup=False),
    )  # fmt: skip
    ctx.plots = Path(args.plots) if args.plots else Path(args.json).resolve().parent
    ctx.options = {k: v for k, v in vars(args).items() if k.startswith(("memory_", "detection_")) and v is not None}
    signal.signal(signal.SIGTERM, _sigterm)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    results: list[BenchResult] = []
    meta: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "repetitions": ctx.reps,
        "kafka_bootstrap": bootstrap,
        "partitions": args.partitions,
        "cpu_count": CPU_COUNT,
        "git": _git(),
    }
    mode = "quick" if args.quick else "full"
    ctx.progress(f"effect-ledger benchmarks ({mode}, {ctx.reps} reps, {CPU_COUNT} cores): {', '.join(names)}")
    interrupted = False
    try:
        if any(BENCHMARKS[n][1] for n in names):
            try:
                wait_ready(KafkaConfig.from_env(bootstrap=bootstrap), timeout=15)
            except BrokerUnavailable as e:
                console.print(f"[red]no Kafka broker: {e}[/red] (set KAFKA_BOOTSTRAP, or use `make bench`)")
                return 2
        for name in names:
            fn, _ = BENCHMARKS[name]
            ctx.progress(f"== {name}")
            t = time.monotonic()
            load_before = os.getloadavg()
            try:
                r = fn(ctx)
            except Skip as e:
                r = BenchResult(name, "skipped", note=str(e))
                ctx.progress(f"{name}: skipped ({e})")
            except KeyboardInterrupt:
                raise
            except Exception as e:
                traceback.print_exc()
                r = BenchResult(name, "error", note=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            finally:
                ctx.cleanup()  # processes, threads, topics and folders of this benchmark
            r.seconds = time.monotonic() - t
            # Other work on the machine shows here (the ratios to raw limits measured alongside are
            # the figures to trust when it is high).
            r.info["loadavg_1m_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
            results.append(r)
            ctx.progress(f"{name}: {r.status} in {r.seconds:.0f} s")
    except KeyboardInterrupt:
        interrupted = True
        console.print("[red]interrupted: cleaning up[/red]")
    finally:
        ctx.cleanup()
    meta["seconds"] = round(time.monotonic() - t0, 1)
    meta["interrupted"] = interrupted
    meta["sqlite_disk"] = disk_info(ctx.tmp_base)
    out = Path(args.json)
    previous = read_previous(out)  # before it is written over: this run is compared with it
    if previous is not None:
        meta["previous"] = {k: previous.get(k) for k in ("started", "git", "quick", "repetitions")}
    write_json(out, results, meta)
    print_table(console, results, f"effect-ledger benchmarks ({mode}, {CPU_COUNT} cores, {meta['seconds']:.0f} s)")
    if previous is not None:
        print_comparison(console, results, previous)
    console.print(f"results written to {out}")
    if interrupted:
        return 130
    return 1 if any(r.status == "error" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
