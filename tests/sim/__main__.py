"""``python -m tests.sim``: run the protocol simulator (``tests/sim/world.py``) over many seeds.

    python -m tests.sim                          # seeds from 0 for 60 s on every core, with progress
    python -m tests.sim --seeds 100000           # a number of seeds instead of a time budget
    python -m tests.sim --seed 4242 --trace      # replay one seed and print its trace
    python -m tests.sim --mode before --seeds 5000   # the design before the log's time decided

Each failing seed is printed with the invariant it broke, the faults its run had switched on, a
one-line replay command and its trace (the steps about the effect that broke it). Exit 1 when a
seed failed. ``make sim`` runs the default; a short fixed-seed run is part of ``make test``
(``tests/unit/test_sim.py``).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import sys
import time
from collections import Counter
from typing import Any

from tests.sim.world import FAULTS, Violation, World, run_seed

CHUNK = 500


def _chunk(
    args: tuple[int, int, str, int, tuple[str, ...] | None],
) -> tuple[int, list[dict[str, Any]], Counter[str], Counter[str]]:
    start, count, mode, steps, forced = args
    failures: list[dict[str, Any]] = []
    seen: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    for seed in range(start, start + count):
        try:
            w = run_seed(seed, mode, steps, forced)
            seen.update(w.seen)
        except Violation as v:
            w = v.world  # type: ignore[attr-defined]
            failures.append({"seed": seed, "what": v.what, "key": v.key, "faults": sorted(w.faults)})
            faults.update(w.faults)
    return count, failures, seen, faults


def _trace(seed: int, mode: str, steps: int, key: str | None, out: Any, faults: tuple[str, ...] | None) -> None:
    w = World(seed, mode, steps, faults)
    try:
        w.run()
        broke = None
    except Violation as v:
        broke, key = v, key or v.key
    clocks = ", ".join(f"{a.name} {a.clock.skew_ms / 1000:+.0f} s" for a in w.agents)
    print(f"seed {seed} ({mode}): faults {', '.join(sorted(w.faults)) or 'none'}", file=out)
    print(f"  clocks: {clocks}, processor {w.proc_clock.skew_ms / 1000:+.0f} s, reconciler "
          f"{w.rec_clock.skew_ms / 1000:+.0f} s, operator {w.op_clock.skew_ms / 1000:+.0f} s", file=out)  # fmt: skip
    print(f"  destinations: {', '.join(f'[{k[-4:]}] {d.kind}' for k, d in w.dest.items())}", file=out)
    tag = f"[{key[-4:]}]" if key else ""
    for t, actor, what in w.trace:
        if not tag or tag in what or "[" not in what:
            print(f"  {t:>9} ms  {actor:<11} {what}", file=out)
    print(f"  -> {broke}" if broke else "  -> every invariant held", file=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60 s; ignored with --seeds)")
    p.add_argument("--seeds", type=int, help="run this many seeds instead of a time budget")
    p.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--seed", type=int, help="replay one seed (with --trace: print its trace)")
    p.add_argument("--trace", action="store_true", help="print the trace of --seed")
    p.add_argument("--mode", choices=("fixed", "before"), default="fixed", help="the design simulated (default fixed)")
    p.add_argument("--steps", type=int, default=240, help="steps with faults on, per seed (default 240)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    p.add_argument("--faults", help="switch on exactly these fault sites (comma-separated; default: drawn per seed)")
    p.add_argument("--show", type=int, default=3, help="failing seeds whose trace is printed (default 3)")
    a = p.parse_args(argv)
    faults = tuple(x for x in (a.faults or "").split(",") if x) if a.faults is not None else None
    unknown = set(faults or ()) - set(FAULTS)
    if unknown:
        p.error(f"unknown fault site(s): {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    forced = f" --faults {a.faults}" if faults is not None else ""
    if a.seed is not None:
        if a.trace:
            _trace(a.seed, a.mode, a.steps, None, sys.stdout, faults)
            return 0
        try:
            run_seed(a.seed, a.mode, a.steps, faults)
        except Violation as v:
            print(f"seed {a.seed}: {v.what}")
            return 1
        print(f"seed {a.seed}: every invariant held")
        return 0

    t0 = time.monotonic()
    done, failures = 0, []
    seen: Counter[str] = Counter()
    fault_counts: Counter[str] = Counter()
    next_start, last_report = a.start, t0

    def chunks() -> Any:
        nonlocal next_start
        while True:
            if a.seeds is not None:
                left = a.start + a.seeds - next_start
                if left <= 0:
                    return
                n = min(CHUNK, left)
            else:
                if time.monotonic() - t0 >= a.seconds:
                    return
                n = CHUNK
            yield (next_start, n, a.mode, a.steps, faults)
            next_start += n

    jobs = max(1, a.jobs)
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        # At most two chunks per process in flight, so a time budget stops the run on time (a pool's
        # imap would read the whole generator ahead).
        source = chunks()
        pending = [pool.apply_async(_chunk, (c,)) for c in itertools.islice(source, 2 * jobs)]
        while pending:
            count, failed, s, f = pending.pop(0).get()
            done += count
            failures += failed
            seen.update(s)
            fault_counts.update(f)
            pending += [pool.apply_async(_chunk, (c,)) for c in itertools.islice(source, 1)]
            now = time.monotonic()
            if now - last_report >= 5:
                rate = done / (now - t0) * 60
                print(f"  {done:,} seeds, {len(failures)} failing, {rate:,.0f} seeds/min", file=sys.stderr, flush=True)
                last_report = now
    elapsed = time.monotonic() - t0
    failures.sort(key=lambda x: x["seed"])
    print(f"{a.mode}: {done:,} seeds (from {a.start}) in {elapsed:.1f} s, {done / elapsed * 60:,.0f} seeds/min on "
          f"{a.jobs} process(es): {len(failures)} failing")  # fmt: skip
    print("  rare paths reached: " + ", ".join(f"{k} {v:,}" for k, v in sorted(seen.items())))
    if failures:
        kinds = Counter(f["what"].split(" (")[0] for f in failures)
        print("  broken: " + "; ".join(f"{k}: {n}" for k, n in kinds.most_common()))
        print("  faults on in the failing seeds: " + ", ".join(f"{k} {fault_counts[k]}" for k in FAULTS))
        for f in failures[:50]:
            replay = f"python -m tests.sim --seed {f['seed']} --mode {a.mode}{forced} --trace"
            print(f"  seed {f['seed']}: {f['what']}  (replay: {replay})")
        for f in failures[: a.show]:
            _trace(f["seed"], a.mode, a.steps, f["key"], sys.stdout, faults)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
