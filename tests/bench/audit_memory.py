"""The audit's memory at any window, without Kafka: ``python -m tests.bench.audit_memory N`` folds N
synthetic events (the effects of ``tests.bench.audit``: intent, execution, receipt) through
``audit()`` as a replay hands them over, one at a time, and prints the peak resident memory
(VmHWM), the events per second and where the spill went. What it shows is the fold's bound
(``MEMORY_EVENTS`` in memory, the rest on disk); the Kafka client's fetch queue is bounded by
itself (``queued.max.messages.kbytes`` in ``effect_ledger.ops.sources``) and measured
by the ``audit_replay`` benchmark."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator

from effect_ledger.ops.audit import MEMORY_EVENTS, audit
from effect_ledger.ops.sources import Replayed
from tests.bench.audit import _effects
from tests.bench.common import rss_mb


def records(n_effects: int, base_ms: int) -> Iterator[Replayed]:
    """The fields of each event as ``Codec.decode_fields`` hands them to the audit (what
    ``effects audit`` reads), built directly: encoding and decoding 10 million events would take
    longer than the fold; one effect of each 10,000 is an example made by ``_effects``, to check
    the shapes agree."""
    (sample,) = list(_effects(1, base_ms, seed=1))
    shapes = [(type(e), {f: getattr(e, f) for f in e.__dataclass_fields__}) for e in sample]
    for d in (shapes[1][1],):
        d["outcome"] = str(d["outcome"])
    shapes[2][1]["source"] = str(shapes[2][1]["source"])
    off = 0
    for i in range(n_effects):
        t = base_ms + 3 * i
        key = f"payments:{i:064x}"
        for k, (model, proto) in enumerate(shapes):
            d = dict(proto, effect_id=key, event_id=f"{t:012x}{i:012x}{k:08x}", at_ms=t + (2 if k else 0))
            if k == 0:
                d["deadline_ms"] = t + 30_000
            elif k == 1:
                d["call_started_ms"], d["call_ended_ms"] = t, t + 2
            else:
                d["receipt_id"] = f"re_{i:016x}"
            yield Replayed(None, None, 0, off, None, True, model, d)
            off += 1


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 10_000_000
    n_effects = n // 3
    base = int(time.time() * 1000) - n_effects * 3 - 3_600_000
    before = rss_mb(os.getpid())["VmRSS"]
    t0 = time.perf_counter()
    report = audit(records(n_effects, base), base, base + n_effects * 3, int(time.time() * 1000))
    secs = time.perf_counter() - t0
    r = rss_mb(os.getpid())
    assert report.events == n_effects * 3 and report.passed, report.to_json()[:2000]
    print(json.dumps({
        "events": report.events, "effects": sum(t.effects for t in report.targets), "seconds": round(secs, 1),
        "events_per_s": round(report.events / secs), "rss_before_MB": round(before, 1),
        "peak_VmHWM_MB": round(r["VmHWM"], 1), "memory_events": MEMORY_EVENTS,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
