"""``python -m tests.bench.wal_frames [--effects N] [--baseline DIR]``: what one effect writes to the
WAL, b-tree by b-tree.

Runs ``N`` sequential ``Ledger.execute`` calls at NORMAL on a fresh file with ``sdk_probe.py`` (its
request, in a process of its own, after its warm-up), which copies the file and its WAL before the
ledger closes (``--snapshot``: nothing checkpointed away), then reads the WAL's frames: each frame
is one page of one transaction, and SQLite writes each with two ``pwrite`` calls (its 24-byte
header, then the page). The pages are named by SQLite's own ``dbstat`` table. With ``--baseline
DIR`` the same runs for another build (``DIR`` as for ``tests.bench.sdk_compare``), beside it.

Prints frames per transaction by b-tree over the last transactions, frames and bytes per effect.
Every page an effect changes is a frame, a page of WAL and, at FULL, part of what the fsync waits
for; fewer pages per effect is the one lever that lowers all three.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sqlite3
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_HEADER = 32  # the WAL file's header
_FRAME_HEADER = 24  # each frame's: page number, commit size, salts, checksums

PROBE = Path(__file__).with_name("sdk_probe.py")


def frames(wal: bytes) -> tuple[int, list[list[int]]]:
    """The WAL's page size and its committed transactions, each the list of page numbers it wrote."""
    if len(wal) < _HEADER:
        return 0, []
    page_size = struct.unpack(">I", wal[8:12])[0]
    txns: list[list[int]] = []
    current: list[int] = []
    off = _HEADER
    while off + _FRAME_HEADER + page_size <= len(wal):
        page, commit = struct.unpack(">II", wal[off : off + 8])
        current.append(page)
        if commit:  # a commit frame holds the database's size in pages after the transaction
            txns.append(current)
            current = []
        off += _FRAME_HEADER + page_size
    return page_size, txns


def owners(db: Path) -> dict[int, str]:
    """Page number -> ``name:pagetype`` from ``dbstat`` (SQLite reads the WAL beside the file)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT name, pageno, pagetype FROM dbstat")
        return {page: f"{name}:{kind}" for name, page, kind in rows}
    finally:
        conn.close()


def measure(effects: int, pythonpath: str | None, workdir: Path) -> dict[str, Any]:
    path = workdir / "ledger.db"
    snap = workdir / "snapshot.db"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, str(PROBE), "sequential", "NORMAL", str(effects), str(path), f"--snapshot={snap}"],
        env=env, check=True, capture_output=True, text=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    effects = probe["n"] + probe["warmup"]  # every effect the file holds
    page_size, txns = frames((workdir / "snapshot.db-wal").read_bytes())
    if not txns:
        raise SystemExit("the WAL holds no transaction: was it checkpointed before the copy?")
    names = owners(snap)
    last = txns[len(txns) // 2 :]  # past the first pages of a fresh file's b-trees
    by_tree: collections.Counter[str] = collections.Counter()
    for txn in last:
        for page in txn:
            by_tree["page 1 (file header)" if page == 1 else names.get(page, "?")] += 1
    per_txn = sum(len(t) for t in last) / len(last)
    per_effect = per_txn * len(txns) / effects
    for p in workdir.iterdir():
        p.unlink()
    return {
        "page_size": page_size,
        "transactions_per_effect": len(txns) / effects,
        "frames_per_transaction": per_txn,
        "frames_per_effect": per_effect,
        "wal_bytes_per_effect": per_effect * (page_size + _FRAME_HEADER),
        "pwrites_per_effect": 2 * per_effect,
        "by_btree": {k: v / len(last) for k, v in by_tree.most_common()},
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.wal_frames", description=__doc__)
    p.add_argument("--effects", type=int, default=1000, help="effects written [1000]")
    p.add_argument("--baseline", help="folder holding another build's effect_ledger package")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = p.parse_args()
    if args.effects < 10:
        p.error("--effects: at least 10")
    builds = {"this": None} | ({"baseline": args.baseline} if args.baseline else {})
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        for name, pythonpath in builds.items():
            results[name] = measure(args.effects, pythonpath, Path(tmp))
    if args.json:
        print(json.dumps(results))
        return
    for name, r in results.items():
        print(
            f"{name}: page size {r['page_size']}, {r['transactions_per_effect']:.2f} transactions per effect, "
            f"{r['frames_per_transaction']:.2f} frames per transaction, {r['frames_per_effect']:.1f} frames "
            f"({r['wal_bytes_per_effect'] / 1024:.1f} KB of WAL, {r['pwrites_per_effect']:.0f} pwrite calls) per effect"
        )
        for tree, n in r["by_btree"].items():
            print(f"  {tree:40s} {n:5.2f} frames per transaction")


if __name__ == "__main__":
    main()
