"""The walk of one effect's key through the source tree: which files a reader follows from
``Ledger.execute`` to the folded state, and how often the walk comes back to a file it had left.

Two legs, each traced with ``sys.setprofile`` / ``threading.setprofile`` (every thread: the ledger
file's writes run on its own thread), counting only effect-ledger's own files:

* the agent: one ``Ledger.execute`` on a fresh embedded ledger, from the call to its return (the
  intent, the call, the receipt, each folded into the file's effects table);
* the processor: that effect's events, as the relay sends them (the codec's bytes), decoded and
  folded by the ledger processor's batch fold into its table value, and the state record encoded
  for ``effects.state``.

``files`` is the number of distinct files entered; ``returns`` the times the walk enters a file it
had entered before and left since; ``rooms`` and ``room returns`` the same for folders.
Run: ``python -m tests.bench.key_walk`` (``--json`` for one object).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SKIP = (ROOT / "tests", ROOT / ".venv")


class Walk:
    """The sequence of effect-ledger files entered while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.seq: list[str] = []
        self._known: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def _ours(self, filename: str) -> str | None:
        hit = self._known.get(filename, "?")
        if hit != "?":
            return hit
        path = Path(filename).resolve()
        # generated code (an Avro writer's ``<avro writer ...>``, ``<string>``, ``<frozen ...>``) is no file
        ours = not filename.startswith("<") and path.is_relative_to(ROOT)
        ours = ours and not any(path.is_relative_to(s) for s in SKIP)
        rel = str(path.relative_to(ROOT)) if ours else None
        self._known[filename] = rel
        return rel

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.active:
            return
        if event == "call":
            here: FrameType | None = frame
        elif event == "return":
            here = frame.f_back
        else:
            return
        while here is not None:
            rel = self._ours(here.f_code.co_filename)
            if rel is not None:
                with self._lock:
                    if not self.seq or self.seq[-1] != rel:
                        self.seq.append(rel)
                return
            if event == "call":
                return  # a library's own frame: not a step of the walk
            here = here.f_back

    def summary(self) -> dict[str, Any]:
        distinct = list(dict.fromkeys(self.seq))
        rooms = [str(Path(p).parent) for p in self.seq]
        rooms = [r for i, r in enumerate(rooms) if i == 0 or rooms[i - 1] != r]
        distinct_rooms = list(dict.fromkeys(rooms))
        return {
            "files": len(distinct),
            "returns": len(self.seq) - len(distinct),
            "rooms": len(distinct_rooms),
            "room_returns": len(rooms) - len(distinct_rooms),
            "path": distinct,
        }


async def agent_leg(walk: Walk, work: Path) -> Path:
    from effect_ledger import Ledger

    declaration = work / "targets.toml"
    declaration.write_text('[targets.payments]\nlookup = "none"\n')
    db = work / "walk.db"
    async with await Ledger.open(str(db), targets=str(declaration)) as ledger:
        walk.active = True
        await ledger.execute(
            target="payments",
            operation="refund.create",
            run_id="run-1",
            step="refund-123",
            request={"order": "123", "amount": 4800},
            call=lambda key: {"id": "re_1"},
        )
        walk.active = False
    return db


def processor_leg(walk: Walk, db: Path) -> None:
    import sqlite3

    from effect_ledger.core.effect import to_state
    from effect_ledger.processors import table_value
    from effect_ledger.processors.batch import fold_key, group_by_key
    from effect_ledger.streams.codec import default_codec

    conn = sqlite3.connect(db)
    try:
        rows = [(k, bytes(v)) for k, v in conn.execute("SELECT effect_id, body FROM events ORDER BY seq")]
    finally:
        conn.close()
    codec = default_codec()
    walk.active = True
    items = [(key, i, codec.decode(value)) for i, (key, value) in enumerate(rows)]
    for events in group_by_key(items).values():
        fold = fold_key(None, events, lambda e: table_value.encode(e, None))
        assert fold.after is not None
        codec.encode(to_state(fold.after))
    walk.active = False


def _line(leg: str, o: dict[str, Any]) -> str:
    return (
        f"{leg:10} files {o['files']:3}  returns {o['returns']:4}"
        f"  rooms {o['rooms']:2}  room returns {o['room_returns']:3}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.key_walk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="effect-ledger-walk-") as tmp:
        for leg in ("agent", "processor"):
            walk = Walk()
            sys.setprofile(walk.hook)
            threading.setprofile(walk.hook)
            try:
                if leg == "agent":
                    db = asyncio.run(agent_leg(walk, Path(tmp)))
                else:
                    processor_leg(walk, db)
            finally:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]
            out[leg] = walk.summary()
    whole = list(dict.fromkeys(out["agent"]["path"] + out["processor"]["path"]))
    out["both"] = {
        "files": len(whole),
        "returns": out["agent"]["returns"] + out["processor"]["returns"],
        "rooms": len({str(Path(p).parent) for p in whole}),
        "room_returns": out["agent"]["room_returns"] + out["processor"]["room_returns"],
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for leg in ("agent", "processor"):
            o = out[leg]
            print(_line(leg, o))
            for p in out[leg]["path"]:
                print(f"    {p}")
        o = out["both"]
        print(_line("both", o))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
