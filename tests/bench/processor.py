"""processor_throughput and memory: the ledger processor (``effects worker``, faust, rocksdb://) as
child processes folding ``effects.events``.

processor_throughput, per repetition, every figure measured in the same repetition (the machine is
shared: only same-run ratios mean something):

1. faust's bare ceiling: faust delivering a pre-filled ``effects.events`` to an agent that does
   nothing (``tests.bench.faust_ceiling``), and a bare consumer's decode + fold (raw fold);
2. 1 worker: a processor starts on empty topics; once it owns the partitions, a bare producer
   writes N events (``layout``: each effect's intent, and its executed + receipt 3,000 effects
   later, so no key's events share a batch); events/s from the first event folded to the last, as
   the worker's health view reports them (``processed``), capped at a time limit;
3. 2 workers: the same with two processors of one group sharing the partitions; ratio to 1 worker;
4. the previous processor (one event at a time, before batching: ``tests.bench.previous_worker``,
   read from git), the same way; ratio of 1 worker to it.

memory: one longer run over up to 1,000,000 effects (3 events each; --quick: 100,000); VmRSS of the
worker sampled as it folds, reported after the last sample with the number of effects folded, the
growth per 100,000 effects over the second half of the run, and (in the JSON only) a linear
projection to the full count when the time budget ended the run first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from effect_ledger.core.effect import Effect, apply
from effect_ledger.processors.supervise import Processor
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.bench.common import (
    ROOT,
    BenchResult,
    Context,
    EventFactory,
    Metric,
    bare_producer,
    cpu_seconds,
    fmt,
    produce_all,
    rss_mb,
)
from tests.bench.previous_worker import PREVIOUS_REV

TARGET_EVENTS_PER_S = 6_000.0  # per worker (issue 11)
TARGET_OF_CEILING = 0.8  # of faust delivering the same records to an agent that does nothing (issue 36)
TARGET_TWO_WORKERS = 1.6  # 2 workers vs 1
TARGET_RSS_MB = 500.0  # worker RSS after 1,000,000 effects (issue 11)
EVENTS_PER_EFFECT = 3
STARTUP_TIMEOUT = 120.0
SPREAD = 3000  # effects between an effect's intent and its outcome in the stream (beyond one batch)


def layout(effects: int, first: int = 0, spread: int = SPREAD) -> Iterator[tuple[int, int]]:
    """(effect, event kind) in stream order: effect i's intent, then — ``spread`` effects later —
    its executed and receipt together, as an agent writes them when its call returns. No key's
    events share a batch of the processor, so each effect is written twice (the harder case).
    A generator: the memory benchmark writes millions."""
    for j in range(first, first + effects + spread):
        if j < first + effects:
            yield (j, 0)
        if j - spread >= first:
            yield (j - spread, 1)
            yield (j - spread, 2)


def prefill(cfg: KafkaConfig, factory: EventFactory, effects: int, first: int = 0) -> int:
    """Write ``effects`` complete effects (intent, executed, receipt; see ``layout``) to
    effects.events; returns the number of events."""
    p = bare_producer(cfg)
    cache: dict[int, list[tuple[bytes, bytes, str, Any]]] = {}

    def records() -> Any:
        for i, kind in layout(effects, first):
            bodies = cache.get(i) or cache.setdefault(i, factory.bodies(i, EVENTS_PER_EFFECT))
            key, value, _, headers = bodies[kind]
            if kind == 2:
                cache.pop(i, None)
            yield key, value, headers

    return produce_all(p, cfg.topics.events, records())


def raw_fold(cfg: KafkaConfig, n: int, timeout: float = 120.0) -> float:
    """events/s of a bare consumer loop: decode + ``apply`` into a dict, no publishing."""
    codec = default_codec()
    c = Consumer(
        cfg.confluent(
            **{
                "group.id": f"bench-raw-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
            }
        )
    )
    c.assign([TopicPartition(cfg.topics.events, p, OFFSET_BEGINNING) for p in range(cfg.partitions)])
    table: dict[str, Effect] = {}
    seen = 0
    t_first = 0.0
    end = time.monotonic() + timeout
    try:
        while seen < n:
            if time.monotonic() > end:
                raise TimeoutError(f"raw fold read {seen} of {n} events in {timeout} s")
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    continue
                if not seen:
                    t_first = time.perf_counter()
                ev = codec.decode(m.value())
                table[ev.effect_id], _ = apply(table.get(ev.effect_id), ev)
                seen += 1
        elapsed = time.perf_counter() - t_first
    finally:
        c.close()
    return (seen - 1) / elapsed if elapsed > 0 else float("nan")


def faust_ceiling(cfg: KafkaConfig, n: int, timeout: float = 180.0) -> float:
    """events/s at which faust hands the records of effects.events to an agent doing nothing."""
    out = Path(tempfile.mkdtemp()) / "rate"
    env = dict(os.environ, FAUST_CEILING_OUT=str(out))
    cmd = [sys.executable, "-m", "tests.bench.faust_ceiling", "--bootstrap", cfg.bootstrap,
           "--topic", cfg.topics.events, "--count", str(n)]  # fmt: skip
    subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, check=False)
    return float(out.read_text()) if out.exists() else float("nan")


class PreviousProcessor(Processor):
    """The processor before batching (``tests.bench.previous_worker``), same arguments."""

    def __init__(self, cfg: KafkaConfig, data_dir: Path, module_dir: Path) -> None:
        super().__init__(cfg, data_dir)
        self.module_dir = module_dir

    def start(self) -> PreviousProcessor:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.previous_worker", "--module-dir", str(self.module_dir), *self.args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
        )  # fmt: skip
        return self


def previous_module(wd: Path) -> Path | None:
    """A folder holding the processor before batching as ``previous_processor.py`` (None: git cannot
    show it, e.g. outside a clone)."""
    r = subprocess.run(["git", "show", f"{PREVIOUS_REV}:processors/processor.py"], cwd=ROOT,
                       capture_output=True, timeout=30, check=False)  # fmt: skip
    if r.returncode != 0:
        return None
    d = wd / "previous"
    d.mkdir(exist_ok=True)
    (d / "previous_processor.py").write_bytes(r.stdout)
    return d


def start_processor(ctx: Context, cfg: KafkaConfig, wd: Path, tag: str) -> Processor:
    proc = Processor(cfg, wd / f"data-{tag}")
    proc.start()
    ctx.on_cleanup(proc.kill)
    return proc


def _log_tail(proc: Processor) -> str:
    return proc.log()[-3000:]


def events_folded(procs: list[Processor]) -> tuple[int, frozenset[int]]:
    """Events folded so far by ``procs`` together (per partition the furthest any of them reports),
    and the partitions they own."""
    best: dict[str, int] = {}
    owned: set[int] = set()
    for proc in procs:
        h = proc.health() or {}
        for p, off in (h.get("processed") or {}).items():
            best[p] = max(best.get(p, -1), int(off))
        if h.get("ready"):
            owned.update(h.get("partitions") or ())
    return sum(o + 1 for o in best.values()), frozenset(owned)


def wait_all_ready(procs: list[Processor], partitions: int, timeout: float = STARTUP_TIMEOUT) -> None:
    """Every worker ready, the partitions split among them (each owns some)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for proc in procs:
            if not proc.alive:
                raise RuntimeError(f"the processor exited:\n{_log_tail(proc)}")
        hs = [proc.health() or {} for proc in procs]
        parts = [frozenset(h.get("partitions") or ()) for h in hs]
        if all(h.get("ready") for h in hs) and all(parts) and sum(len(p) for p in parts) == partitions:
            return
        time.sleep(0.1)
    raise TimeoutError(f"workers not ready with the partitions split after {timeout} s:\n{_log_tail(procs[0])}")


def fold_rate(ctx: Context, procs: list[Processor], cfg: KafkaConfig, factory: EventFactory, effects: int,
              cap: float) -> tuple[float, int, float]:  # fmt: skip
    """Start ``procs`` on ``cfg``'s empty topics, wait until they own the partitions, then fill
    effects.events and time the fold from the first event folded to the last (or ``cap`` s of
    folding). Returns (events/s, events folded, worker CPU ms per event)."""
    for proc in procs:
        proc.start()
        ctx.on_cleanup(proc.kill)
    try:
        wait_all_ready(procs, cfg.partitions)
        base, _ = events_folded(procs)
        pids = [proc.proc.pid for proc in procs if proc.proc is not None]
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        filler = threading.Thread(target=prefill, args=(cfg, factory, effects))
        filler.start()
        total = effects * EVENTS_PER_EFFECT
        t_first = count = 0.0
        n = base
        end = time.monotonic() + cap + 60
        while time.monotonic() < end:
            n, _ = events_folded(procs)
            now = time.monotonic()
            if not t_first and n > base:
                t_first, count = now, n
                end = now + cap
            if n - base >= total:
                break
            for proc in procs:
                if not proc.alive:
                    raise RuntimeError(f"the processor exited:\n{_log_tail(proc)}")
            time.sleep(0.05)
        t_last = time.monotonic()
        cpu1 = sum(cpu_seconds(pid) for pid in pids)
        filler.join(120)
    finally:
        for proc in procs:
            proc.kill()
    done = int(n - base)
    rate = (n - count) / (t_last - t_first) if t_first and t_last > t_first else float("nan")
    return rate, done, (cpu1 - cpu0) * 1000 / max(1, done)


def run_throughput(ctx: Context) -> BenchResult:
    effects = ctx.size(30_000, 12_000)
    cap = ctx.size(20.0, 10.0)  # seconds of folding per measurement at most
    wd = ctx.workdir("proc")
    factory = EventFactory()
    factory.check()
    previous = previous_module(wd)
    one = Metric(
        "events folded and published, 1 worker", "events/s", [], higher_is_better=True,
        target=TARGET_EVENTS_PER_S, ratio_target=TARGET_OF_CEILING,
        raw_what="faust delivering the same records to an agent that does nothing, events/s (same run)",
    )  # fmt: skip
    two = Metric("2 workers vs 1 (same run)", "x", [], higher_is_better=True, target=TARGET_TWO_WORKERS)
    prev = Metric("batched vs the previous processor (same run)", "x", [], higher_is_better=True)
    raws, twos, prevs, cpu, cpu2 = [], [], [], [], []
    prev_failed = ""
    for rep in range(ctx.reps):
        # One topic set per measurement (a fresh group folds from the start), in the same rep.
        cfg = ctx.kafka("proc")
        events = prefill(cfg, factory, effects)
        raws.append(raw_fold(cfg, events))
        one.raw_limit_runs.append(faust_ceiling(cfg, events))
        ctx.drop(cfg)
        cfg = ctx.kafka("proc1")
        r1, n1, c1 = fold_rate(ctx, [Processor(cfg, wd / f"one-{rep}")], cfg, factory, effects, cap)
        ctx.drop(cfg)
        one.runs.append(r1)
        one.ratio_runs.append(r1 / one.raw_limit_runs[-1])  # the ceiling of the same repetition
        cpu.append(c1)
        cfg = ctx.kafka("proc2")
        procs = [Processor(cfg, wd / f"two-{rep}-{i}") for i in range(2)]
        r2, n2, c2 = fold_rate(ctx, procs, cfg, factory, effects, cap)
        ctx.drop(cfg)
        two.runs.append(r2 / r1)
        twos.append(r2)
        cpu2.append(c2)
        line = (
            f"processor rep {rep + 1}/{ctx.reps}: 1 worker {fmt(r1)} events/s ({n1} events, {c1:.2f} ms CPU/event), "
            f"faust bare {fmt(one.raw_limit_runs[-1])} ({r1 / one.raw_limit_runs[-1]:.2f}x), raw fold {fmt(raws[-1])}; "
            f"2 workers {fmt(r2)} events/s "
            f"({r2 / r1:.2f}x)"
        )
        if previous is not None:
            cfg = ctx.kafka("prev")
            try:
                rp, np_, _ = fold_rate(ctx, [PreviousProcessor(cfg, wd / f"prev-{rep}", previous)], cfg, factory,
                                       effects, cap)  # fmt: skip
            except RuntimeError as e:
                # The old processor imports modules that have moved since: the row is left out
                # rather than the whole benchmark (the figures of this tree stand on their own).
                previous, prev_failed = None, str(e).splitlines()[-1]
            else:
                prev.runs.append(r1 / rp)
                prevs.append(rp)
                line += f"; previous processor {fmt(rp)} events/s ({r1 / rp:.2f}x)"
            ctx.drop(cfg)
        ctx.progress(line)
    one.extra = {
        "effects_per_measurement": effects,
        "layout": f"intent, then executed + receipt {SPREAD} effects later (each effect written twice)",
        "time_cap_s": cap,
        "worker_cpu_ms_per_event": cpu,
        "raw_fold_events_per_s": raws,
        "of_faust_bare_per_rep": [r / c for r, c in zip(one.runs, one.raw_limit_runs, strict=True)],
        "store": "rocksdb://",
        "partitions": ctx.partitions,
    }
    two.extra = {"two_workers_events_per_s": twos, "worker_cpu_ms_per_event": cpu2}
    prev.extra = {"previous_events_per_s": prevs, "previous_rev": PREVIOUS_REV}
    metrics = [one, two] + ([prev] if prevs else [])
    ctx.shared["processor_events_per_s"] = one.median
    note = None if previous is not None else "the previous processor could not be read from git: not compared"
    if prev_failed:
        note = f"the previous processor did not start ({prev_failed}): not compared"
    return BenchResult("processor_throughput", "ran", metrics, note=note, info={"events_per_effect": EVENTS_PER_EFFECT})


def _fit_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def run_memory(ctx: Context) -> BenchResult:
    target_effects = int(ctx.options.get("memory_effects") or ctx.size(1_000_000, 100_000))
    budget = float(ctx.options.get("memory_budget", ctx.size(90.0, 20.0)))  # seconds of folding; 0: no limit
    est = max(float(ctx.shared.get("processor_events_per_s") or 0), 2000.0)
    effects = target_effects if budget <= 0 else min(target_effects, int(est * budget * 1.5 / EVENTS_PER_EFFECT) + 1000)
    budget = budget if budget > 0 else float("inf")
    wd = ctx.workdir("mem")
    factory = EventFactory()
    cfg = ctx.kafka("mem")
    t = time.monotonic()
    events = prefill(cfg, factory, effects)
    ctx.progress(f"memory: {effects} effects ({events} events) written in {time.monotonic() - t:.1f} s")
    samples: list[dict[str, Any]] = []
    # The events folded come from the worker's health view (one state per key per batch).
    proc = start_processor(ctx, cfg, wd, "mem")
    assert proc.proc is not None
    pid = proc.proc.pid
    proc.wait_ready(STARTUP_TIMEOUT)
    t_first = time.monotonic()
    ready_rss = rss_mb(pid)
    next_sample = 0.0
    while True:
        now = time.monotonic()
        done, _ = events_folded([proc])
        if now >= next_sample or done >= events:
            r = rss_mb(pid)
            rocksdb = (proc.health() or {}).get("rocksdb") or {}  # the worker's RocksDB, by its own counts
            samples.append({"t_s": round(now - t_first, 1), "effects": done / EVENTS_PER_EFFECT, **r,
                            **{f"rocksdb_{k}_MB": v / 1e6 for k, v in rocksdb.items()}})  # fmt: skip
            next_sample = now + 2.0
        if done >= events or now - t_first > budget:
            break
        if not proc.alive:
            raise RuntimeError(f"the processor exited:\n{_log_tail(proc)}")
        time.sleep(0.25)
    proc.kill()
    last = samples[-1]
    folded = last["effects"]
    half = [(s["effects"], s["VmRSS"]) for s in samples if s["effects"] >= folded / 2]
    slope = _fit_slope(half)  # MB per effect
    per_100k = slope * 100_000 if slope is not None else None
    # "Flat once RocksDB's caches are full": the growth over the last quarter of the run, beside
    # the second half's.
    quarter = _fit_slope([(s["effects"], s["VmRSS"]) for s in samples if s["effects"] >= folded * 3 / 4])
    plot = _memory_plot(ctx, samples, ready_rss["VmRSS"])
    projected = last["VmRSS"] + slope * (target_effects - folded) if slope is not None else None
    # The target (<= 500 MB) is about 1,000,000 effects: checked only when the run got there.
    m = Metric(
        f"worker RSS after folding {int(folded):,} effects", "MB", [last["VmRSS"]], higher_is_better=False,
        target=TARGET_RSS_MB if folded >= 1_000_000 else None,
        extra={
            "effects_folded": int(folded),
            "target_effects": target_effects,
            "completed": folded >= target_effects,
            "peak_VmHWM_MB": last["VmHWM"],
            "rss_when_ready_MB": ready_rss["VmRSS"],
            "growth_MB_per_100k_effects": per_100k,
            "growth_MB_per_100k_effects_last_quarter": quarter * 100_000 if quarter is not None else None,
            "plot": str(plot) if plot else None,
            "linear_projection_MB_at_target": projected,
            "projection_note": (
                None
                if folded >= target_effects
                else f"extrapolated from {int(folded):,} of {target_effects:,} effects: not a measurement"
            ),
            "samples": samples,
        },
    )  # fmt: skip
    res = BenchResult(
        "memory", "ran", [m],
        note="the audit part is not measured yet (effects audit is being built)",
        info={"events_per_effect": EVENTS_PER_EFFECT, "time_budget_s": budget, "store": "rocksdb://"},
    )  # fmt: skip
    ctx.progress(
        f"memory: RSS {fmt(last['VmRSS'])} MB after {int(folded):,} effects (ready: {fmt(ready_rss['VmRSS'])} MB; "
        f"+{fmt(per_100k)} MB per 100k effects over the second half, "
        f"+{fmt(quarter * 100_000 if quarter is not None else None)} over the last quarter)"
        + (f"; plot {plot}" if plot else "")
    )
    ctx.drop(cfg)
    return res


def rss_series(samples: list[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """(effects folded, VmRSS MB, VmHWM MB) per sample, in the order taken."""
    return [(float(s["effects"]), float(s["VmRSS"]), float(s["VmHWM"])) for s in samples]


def _memory_plot(ctx: Context, samples: list[dict[str, Any]], ready_mb: float) -> Path | None:
    """RSS against effects folded, as a PNG in ``ctx.plots`` (None: no folder, or no matplotlib)."""
    if ctx.plots is None or len(samples) < 2:
        return None
    try:
        from tests.bench.plots import Panel, Series, draw
    except ImportError:  # the [bench] extra is not installed: the JSON still has the samples
        return None
    xs, rss, hwm = zip(*rss_series(samples), strict=True)
    effects = [x / 1000 for x in xs]
    rocksdb = [
        Series(label, [s["effects"] / 1000 for s in samples if key in s], [s[key] for s in samples if key in s], style)
        for key, label, style in (
            ("rocksdb_cache_usage_MB", "RocksDB cache in use (blocks, index, filters, memtables)", "-"),
            ("rocksdb_cache_capacity_MB", "RocksDB cache capacity", ":"),
        )
        if any(key in s for s in samples)
    ]
    return draw(ctx.plots / "bench-memory.png", f"effects worker RSS while folding {int(xs[-1]):,} effects",
                "effects folded (thousands)", [Panel("MB", [
                    Series("VmRSS", effects, list(rss)), Series("VmHWM (peak)", effects, list(hwm), "--"), *rocksdb,
                    Series("RSS when ready", [effects[0], effects[-1]], [ready_mb, ready_mb], ":"),
                    Series("target after 1,000,000 effects", [effects[0], effects[-1]], [TARGET_RSS_MB] * 2, "-."),
                ])])  # fmt: skip


def run_takeover(ctx: Context) -> BenchResult:
    """Seconds from a worker's kill -9 until the surviving worker of its group owns every partition
    and is ready (folding again), beside the group's session timeout (how long the broker waits for
    a silent member: the floor of any takeover)."""
    from effect_ledger.processors.faust_settings import SESSION_TIMEOUT_S

    wd = ctx.workdir("takeover")
    m = Metric(
        "takeover after a worker's kill -9, 2 workers", "s", [], higher_is_better=False,
        raw_what="the group's session timeout (s)",
    )  # fmt: skip
    for rep in range(ctx.reps):
        cfg = ctx.kafka("takeover")
        a = start_processor(ctx, cfg, wd, f"a{rep}")
        b = start_processor(ctx, cfg, wd, f"b{rep}")
        wait_all_ready([a, b], cfg.partitions)
        t0 = time.monotonic()
        a.kill()
        took = float("nan")
        while time.monotonic() - t0 < 180:
            h = b.health() or {}
            if h.get("ready") and len(h.get("partitions") or ()) == cfg.partitions:
                took = time.monotonic() - t0
                break
            if not b.alive:
                raise RuntimeError(f"the surviving processor exited:\n{_log_tail(b)}")
            time.sleep(0.1)
        b.kill()
        ctx.drop(cfg)
        m.runs.append(took)
        m.raw_limit_runs.append(SESSION_TIMEOUT_S)
        ctx.progress(f"takeover rep {rep + 1}/{ctx.reps}: {took:.1f} s (session timeout {SESSION_TIMEOUT_S:.0f} s)")
    return BenchResult("takeover", "ran", [m])
