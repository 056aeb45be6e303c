"""``python -m tests.bench.sdk_compare --baseline DIR``: ``Ledger.execute`` and ``SyncLedger.execute``
(with a call thread, and with ``inline_calls``) of this tree beside another build of effect-ledger
(today's main, say), measured in the same run, interleaved; for each build, also the sync rows'
ratio to its own ``Ledger.execute`` (issue 36's target for them).

``DIR`` holds an ``effect_ledger`` package of the other build (its ``streams``, ``processors`` and
``schemas`` folders linked in, as ``make lint`` does for mypy), for example::

    git archive 4432fc9 | tar -x -C /tmp/oldmain
    mkdir -p /tmp/oldpkg/effect_ledger
    for f in /tmp/oldmain/effect_ledger/*; do ln -s "$f" /tmp/oldpkg/effect_ledger/; done
    for d in schemas streams processors; do ln -s /tmp/oldmain/$d /tmp/oldpkg/effect_ledger/$d; done
    .venv/bin/python -m tests.bench.sdk_compare --baseline /tmp/oldpkg

Each measurement is a fresh process on a fresh file (``sdk_probe.py``, with ``PYTHONPATH`` set to
``DIR`` for the baseline); per repetition the two builds alternate. Prints medians and ratios, and
two more rows: this tree's concurrent run with its SQL made a no-op (``sdk_probe.py --no-sql``), the
Python side's own limit, and the share of it this tree keeps with SQLite; and what this tree's
sequential FULL run spent per effect outside the ledger's Python (``sdk_probe.py --parts``: the
intent's transaction with its fsync, on the loop's thread while the disk is fast, the hops to the
store's thread and back when it was not, the outcome's commit on the loop's thread), beside the
baseline's whole FULL cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROBE = Path(__file__).with_name("sdk_probe.py")
ROWS = [
    ("sequential", "NORMAL"),
    ("sequential", "FULL"),
    ("concurrent", "NORMAL"),
    ("sync", "NORMAL"),  # SyncLedger.execute, sequential, with a call thread
    ("sync-inline", "NORMAL"),  # the same with inline_calls
]


def probe(mode: str, durability: str, n: int, path: Path, pythonpath: str | None, *flags: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, str(PROBE), mode, durability, str(n), str(path), *flags],
        env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["confirmed"] != result["n"]:
        raise SystemExit(f"{mode} {durability}: only {result['confirmed']} of {result['n']} effects CONFIRMED")
    return result


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.sdk_compare", description=__doc__)
    p.add_argument("--baseline", required=True, help="folder holding the other build's effect_ledger package")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--n", type=int, default=2000, help="effects per sequential measurement [2000]")
    p.add_argument("--n-concurrent", type=int, default=6400, help="effects per concurrent measurement [6400]")
    args = p.parse_args()
    runs: dict[tuple[str, str, str], list[float]] = {}
    cpu: dict[tuple[str, str, str], list[float]] = {}
    parts: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        for rep in range(args.reps):
            for mode, dur in ROWS:
                n = args.n_concurrent if mode == "concurrent" else args.n
                for build, pp in (("baseline", args.baseline), ("this", None)):
                    timed = ("--parts",) if build == "this" and (mode, dur) == ("sequential", "FULL") else ()
                    r = probe(mode, dur, n, Path(tmp) / f"{build}-{mode}-{dur}-{rep}.db", pp, *timed)
                    for part, us in r.get("parts", {}).items():
                        parts.setdefault(part, []).append(us)
                    value = r["effects_per_s"] if mode == "concurrent" else r["us_per_effect"]
                    runs.setdefault((mode, dur, build), []).append(value)
                    cpu.setdefault((mode, dur, build), []).append(r["cpu_us_per_effect"])
                    print(f"rep {rep + 1}: {mode} {dur} {build}: {value:,.0f}", file=sys.stderr)
            # The same concurrent row with the SQL taken out: how much of this tree's cost is Python.
            r = probe("concurrent", "NORMAL", args.n_concurrent, Path(tmp) / f"nosql-{rep}.db", None, "--no-sql")
            runs.setdefault(("concurrent", "NORMAL", "no-sql"), []).append(r["effects_per_s"])
            print(f"rep {rep + 1}: concurrent NORMAL this, SQL a no-op: {r['effects_per_s']:,.0f}", file=sys.stderr)
    # CPU (every thread of the process) beside wall time: on a shared machine it is the steadier one.
    head = f"{'row':<22} {'baseline':>12} {'this':>12} {'ratio':>7}"
    print(f"{head}   {'CPU us/effect: baseline':>24} {'this':>6} {'ratio':>6}")
    for mode, dur in ROWS:
        unit = "effects/s" if mode == "concurrent" else "us/effect"
        b_runs, t_runs = runs[(mode, dur, "baseline")], runs[(mode, dur, "this")]
        base, this = statistics.median(b_runs), statistics.median(t_runs)
        ratio = statistics.median(t / b for t, b in zip(t_runs, b_runs, strict=True))
        b_cpu, t_cpu = cpu[(mode, dur, "baseline")], cpu[(mode, dur, "this")]
        cpu_ratio = statistics.median(t / b for t, b in zip(t_cpu, b_cpu, strict=True))
        print(
            f"{mode + ' ' + dur:<22} {base:>12,.0f} {this:>12,.0f} {ratio:>6.2f}x   {statistics.median(b_cpu):>24,.0f} "
            f"{statistics.median(t_cpu):>6,.0f} {cpu_ratio:>5.2f}x  ({unit}, median of {args.reps})"
        )
    # The sync rows against each build's own Ledger.execute, as make bench's sdk_peers compares them.
    for mode in ("sync", "sync-inline"):
        each = {
            build: statistics.median(
                s / a for s, a in zip(runs[(mode, "NORMAL", build)], runs[("sequential", "NORMAL", build)], strict=True)
            )
            for build in ("baseline", "this")
        }
        print(
            f"{mode + ' / async':<22} {each['baseline']:>11.2f}x {each['this']:>11.2f}x   "
            f"SyncLedger.execute over the same build's Ledger.execute, NORMAL (median of {args.reps})"
        )
    nosql = runs[("concurrent", "NORMAL", "no-sql")]
    with_sql = runs[("concurrent", "NORMAL", "this")]
    share = statistics.median(t / x for t, x in zip(with_sql, nosql, strict=True))
    print(
        f"{'concurrent, SQL a no-op':<22} {'':>12} {statistics.median(nosql):>12,.0f}   this tree's Python alone: "
        f"with SQLite it runs at {share:.2f} of this (effects/s, median of {args.reps})"
    )
    # Sequential FULL: each effect is the intent's transaction with its fsync (on the loop's thread
    # while the disk is fast, else on the store's, with a hop there and back) plus the outcome's
    # commit on the loop's thread.
    floor = {k: statistics.median(v) for k, v in parts.items()}
    if {"intent_txn_us", "outcome_commit_us"} <= floor.keys():
        on_loop = floor.get("intent_on_loop_share", 0.0)
        hop = floor.get("hop_us", 0.0) * (1.0 - on_loop)
        total = floor["intent_txn_us"] + hop + floor["outcome_commit_us"]
        base_full = statistics.median(runs[("sequential", "FULL", "baseline")])
        print(
            f"{'sequential FULL, parts':<22} {'':>12} {total:>12,.0f}   not the ledger's Python: intent's transaction "
            f"with its fsync {floor['intent_txn_us']:,.0f} ({on_loop:.0%} on the loop's thread) + hops {hop:,.0f} "
            f"+ outcome's commit {floor['outcome_commit_us']:,.0f}; {total / base_full:.2f} of the baseline's whole "
            f"FULL cost (us/effect, medians of {args.reps})"
        )


if __name__ == "__main__":
    main()
