"""processor_throughput and memory: the ledger processor (``effects worker``, faust, rocksdb://) as a
child process folding a pre-filled ``effects.events``.

processor_throughput, per repetition, on a fresh topic set:

1. a bare producer fills ``effects.events`` with N events (intent + executed + receipt of N/3
   effects: each effect ends CONFIRMED, no deadline fires);
2. raw limit: a bare confluent-kafka consumer reads them back, decodes each and folds it
   (``effect_ledger.streams.effect.apply``) into a dict, without publishing; events/s from its first record to its
   last;
3. a Processor starts; the figure is events/s from the first record on ``effects.state`` to the last
   (their broker timestamps; the worker's start-up is excluded). A full fold publishes one state per
   event, so the run ends when ``effects.state`` holds N records, or after a time cap (then the
   figure is the rate over the records published so far, and ``completed`` says so).

memory: one longer run over up to 1,000,000 effects (3 events each; --quick: 100,000); VmRSS of the
worker sampled as it folds, reported after the last sample with the number of effects folded, the
growth per 100,000 effects over the second half of the run, and (in the JSON only) a linear
projection to the full count when the time budget ended the run first.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from effect_ledger.processors.supervise import Processor
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.effect import Effect, apply
from tests.bench.common import (
    BenchResult,
    Context,
    EventFactory,
    Metric,
    Watermarks,
    bare_producer,
    cpu_seconds,
    fmt,
    produce_all,
    rss_mb,
)

TARGET_EVENTS_PER_S = 10_000.0
EVENTS_PER_EFFECT = 3
STARTUP_TIMEOUT = 120.0


def prefill(cfg: KafkaConfig, factory: EventFactory, effects: int, first: int = 0) -> int:
    """Write ``effects`` complete effects (intent, executed, receipt) to effects.events; returns the
    number of events."""
    p = bare_producer(cfg)
    records = (
        (key, value, headers)
        for i in range(first, first + effects)
        for key, value, _, headers in factory.bodies(i, EVENTS_PER_EFFECT)
    )
    return produce_all(p, cfg.topics.events, records)


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


def start_processor(ctx: Context, cfg: KafkaConfig, wd: Path, tag: str) -> Processor:
    proc = Processor(cfg, wd / f"data-{tag}")
    proc.start()
    ctx.on_cleanup(proc.kill)
    return proc


def _log_tail(proc: Processor) -> str:
    return proc.log()[-3000:]


def wait_first_state(proc: Processor, wm: Watermarks, t_start: float) -> float:
    """Poll until effects.state has a record; returns the wall time it was seen."""
    while True:
        if not proc.alive:
            raise RuntimeError(f"the processor exited:\n{_log_tail(proc)}")
        if wm.total() > 0:
            return time.monotonic()
        if time.monotonic() - t_start > STARTUP_TIMEOUT:
            raise TimeoutError(f"no state published {STARTUP_TIMEOUT:.0f} s after start:\n{_log_tail(proc)}")
        time.sleep(0.1)


def run_throughput(ctx: Context) -> BenchResult:
    n = ctx.size(100_000, 30_000)
    n -= n % EVENTS_PER_EFFECT
    cap = ctx.size(20.0, 8.0)  # seconds of folding per repetition at most
    wd = ctx.workdir("proc")
    factory = EventFactory()
    factory.check()
    m = Metric(
        "events folded and published", "events/s", [], higher_is_better=True, target=TARGET_EVENTS_PER_S,
        raw_what="bare consumer: decode + apply into a dict, events/s",
    )  # fmt: skip
    startup, completed, cpu_ms, counts = [], [], [], []
    ceiling: list[float] = []
    for rep in range(ctx.reps):
        cfg = ctx.kafka("proc")
        t = time.monotonic()
        events = prefill(cfg, factory, n // EVENTS_PER_EFFECT)
        ctx.progress(f"processor rep {rep + 1}/{ctx.reps}: {events} events written in {time.monotonic() - t:.1f} s")
        raw = raw_fold(cfg, events)
        m.raw_limit_runs.append(raw)
        ceiling.append(faust_ceiling(cfg, events))
        wm = Watermarks(cfg, cfg.topics.state)
        try:
            t_start = time.monotonic()
            proc = start_processor(ctx, cfg, wd, f"r{rep}")
            t_first = wait_first_state(proc, wm, t_start)
            assert proc.proc is not None
            pid = proc.proc.pid
            cpu0 = cpu_seconds(pid)
            startup.append(t_first - t_start)
            while time.monotonic() - t_first < cap:
                if wm.total() >= events:
                    break
                if not proc.alive:
                    raise RuntimeError(f"the processor exited:\n{_log_tail(proc)}")
                time.sleep(0.25)
            cpu1 = cpu_seconds(pid)
            first_ms, last_ms, count = wm.time_span_ms()
            proc.kill()
        finally:
            wm.close()
        rate = (count - 1) / ((last_ms - first_ms) / 1000) if last_ms > first_ms else float("nan")
        m.runs.append(rate)
        completed.append(count >= events)
        counts.append(count)
        cpu_ms.append((cpu1 - cpu0) * 1000 / max(1, count))
        ctx.progress(
            f"processor rep {rep + 1}/{ctx.reps}: {fmt(rate)} events/s ({count}/{events} states in "
            f"{(last_ms - first_ms) / 1000:.1f} s, start-up {startup[-1]:.1f} s, "
            f"{cpu_ms[-1]:.2f} ms worker CPU/event); raw fold {fmt(raw)} events/s"
        )
        ctx.drop(cfg)
    m.extra = {
        "events_written": n,
        "states_published": counts,
        "completed": completed,
        "time_cap_s": cap,
        "startup_s": startup,
        "worker_cpu_ms_per_event": cpu_ms,
        "store": "rocksdb://",
        "partitions": ctx.partitions,
        # faust itself, delivering the same records to an agent that does nothing with them
        "faust_bare_events_per_s": ceiling,
    }
    ctx.progress(
        f"processor: faust's own ceiling here (an agent that does nothing): {fmt(statistics.median(ceiling))} events/s"
    )
    ctx.shared["processor_events_per_s"] = m.median
    return BenchResult("processor_throughput", "ran", [m], info={"events_per_effect": EVENTS_PER_EFFECT})


def _fit_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def run_memory(ctx: Context) -> BenchResult:
    target_effects = ctx.size(1_000_000, 100_000)
    budget = ctx.size(90.0, 20.0)  # seconds of folding
    est = max(float(ctx.shared.get("processor_events_per_s") or 0), 2000.0)
    effects = min(target_effects, int(est * budget * 1.5 / EVENTS_PER_EFFECT) + 1000)
    wd = ctx.workdir("mem")
    factory = EventFactory()
    cfg = ctx.kafka("mem")
    t = time.monotonic()
    events = prefill(cfg, factory, effects)
    ctx.progress(f"memory: {effects} effects ({events} events) written in {time.monotonic() - t:.1f} s")
    wm = Watermarks(cfg, cfg.topics.state)
    samples: list[dict[str, Any]] = []
    try:
        t_start = time.monotonic()
        proc = start_processor(ctx, cfg, wd, "mem")
        assert proc.proc is not None
        pid = proc.proc.pid
        proc.wait_ready(STARTUP_TIMEOUT)
        t_first = wait_first_state(proc, wm, t_start)
        ready_rss = rss_mb(pid)
        next_sample = 0.0
        while True:
            now = time.monotonic()
            done = wm.total()
            if now >= next_sample or done >= events:
                r = rss_mb(pid)
                samples.append({"t_s": round(now - t_first, 1), "effects": done / EVENTS_PER_EFFECT, **r})
                next_sample = now + 2.0
            if done >= events or now - t_first > budget:
                break
            if not proc.alive:
                raise RuntimeError(f"the processor exited:\n{_log_tail(proc)}")
            time.sleep(0.25)
        proc.kill()
    finally:
        wm.close()
    last = samples[-1]
    folded = last["effects"]
    half = [(s["effects"], s["VmRSS"]) for s in samples if s["effects"] >= folded / 2]
    slope = _fit_slope(half)  # MB per effect
    per_100k = slope * 100_000 if slope is not None else None
    projected = last["VmRSS"] + slope * (target_effects - folded) if slope is not None else None
    m = Metric(
        f"worker RSS after folding {int(folded):,} effects", "MB", [last["VmRSS"]], higher_is_better=False,
        extra={
            "effects_folded": int(folded),
            "target_effects": target_effects,
            "completed": folded >= target_effects,
            "peak_VmHWM_MB": last["VmHWM"],
            "rss_when_ready_MB": ready_rss["VmRSS"],
            "growth_MB_per_100k_effects": per_100k,
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
        f"+{fmt(per_100k)} MB per 100k effects)"
    )
    ctx.drop(cfg)
    return res
