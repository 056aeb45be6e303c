"""audit_replay: ``effects audit --from T --to T`` over a replayed window of effects.events.

Once, on a fresh topic set (timed separately, not the benchmark): a bare confluent-kafka Producer
with the relay's settings (``effect_ledger.sdk.kafka.relay.producer_config``) fills ``effects.events`` with N events
(--quick: 100,000) of N/3 realistic effects, each as the SDK writes it: an intent, the execution
(OK) and its receipt, keyed by the effect id, encoded with the real codec, with the Kafka timestamp
set to the event's ``at_ms``. One effect begins every ``STEP_MS`` ms and its three events fall inside
those ms, so timestamps only grow along every partition; the window [first intent, last intent + 1)
holds every effect and every event. All of them end CONFIRMED, so every check of the audit passes.

Each repetition measures, on that topic (the order alternates between repetitions):

* raw limit: a bare consumer assigned to every partition at ``offsets_for_times(window start)``,
  reading to the end offsets (high watermarks at the start) and decoding every value with
  ``effect_ledger.streams.codec.default_codec().decode``; the fetch settings of
  ``effect_ledger.ops.sources``;
* in-process: ``audit(replay_events(cfg, start, build=False), start, end, now)`` in this process;
* the command: ``python -m effect_ledger audit --prefix P --from START --to END --json`` as a child
  process: wall time from spawn to exit (Python start-up, imports and the broker handshake included),
  its CPU time, and its peak resident memory (VmHWM, polled from /proc every 20 ms); its JSON must
  count every event and every effect, and pass every check.

events/s = N / wall seconds (creating the consumer and the offset look-ups included); the CPU per
event (every thread of the process) is in the JSON, less sensitive to other load on the machine.
The command's fixed cost is measured on an empty window (after the last event: nothing to replay).

Memory: the command's peak RSS is the headline. The growth per 100,000 effects comes from a child
process running the same fold with a progress callback: VmRSS after the last consumed batch minus
VmRSS before the replay, both after ``malloc_trim`` (librdkafka's pre-fetch queue, up to
``queued.max.messages.kbytes``, is empty by then and its memory handed back), over the effects
folded. A second probe measures the Python heap (tracemalloc; slower, not timed) on the last
``HEAP_PROBE_EFFECTS`` effects: what the fold itself keeps per effect.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from effect_ledger.core.keys import canonical_json, effect_key
from effect_ledger.core.model import Executed, Intent, Outcome, Receipt, ReceiptSource
from effect_ledger.ops.audit import audit
from effect_ledger.ops.sources import replay_events
from effect_ledger.streams.codec import HEADER, default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.bench.common import (
    ROOT,
    BenchResult,
    Context,
    Headers,
    Metric,
    Watermarks,
    bare_producer,
    fmt,
    now_ms,
    rss_mb,
)

TARGET_EVENTS_PER_S = 100_000.0
TARGET_RATIO = 0.8  # of the bare consume + decode, in the same run
# EFFECTS_BENCH_AUDIT_EVENTS: another size (e.g. 10000000). Above PROBE_MAX_EVENTS the two memory
# probes (each one more replay of the whole window) are skipped: the command's peak RSS remains.
SIZE_ENV = "EFFECTS_BENCH_AUDIT_EVENTS"
PROBE_MAX_EVENTS = 2_000_000
EVENTS_PER_EFFECT = 3
STEP_MS = 3  # one effect begins every 3 ms; its intent at +0, execution and receipt at +2
DEADLINE_MS = 30_000
MAX_REPS = 3  # a full repetition replays 1,000,000 events three times (about 2 minutes here)
FLUSH_TIMEOUT = 120.0
HEAP_PROBE_EFFECTS = 50_000  # tracemalloc slows the fold: its probe replays only the last ones
# What effect_ledger.ops.sources._consumer sets: the raw consumer fetches like the replay does.
FETCH = {"fetch.max.bytes": 52_428_800, "queued.max.messages.kbytes": 262_144}


@dataclass(frozen=True)
class Window:
    start_ms: int  # the first intent
    end_ms: int  # after the last intent (exclusive)
    last_event_ms: int
    effects: int
    events: int


# -- the fill --------------------------------------------------------------------------------------


def _event_id(rng: random.Random, at_ms: int) -> str:
    """Like ``effect_ledger.sdk.ledger.new_event_id``: 48-bit ms then 80 random bits, 32 hex characters."""
    return f"{at_ms:012x}{rng.getrandbits(80):020x}"


def _effects(n_effects: int, base_ms: int, seed: int) -> Iterator[tuple[Intent | Executed | Receipt, ...]]:
    """The events of ``n_effects`` effects as ``Ledger.execute`` writes them: the intent, then (one
    write) the execution and its receipt. Nine in ten on ``payments``, one in ten on ``tickets``."""
    rng = random.Random(seed)
    run_id = f"bench-audit-{seed:08x}"
    workers = [f"bench-host-{w}:{4000 + w}:1717171717:{rng.getrandbits(32):08x}" for w in range(4)]
    for i in range(n_effects):
        t = base_ms + i * STEP_MS
        target, operation = ("tickets", "create") if i % 10 == 0 else ("payments", "refund.create")
        step = f"step-{i}"
        key = effect_key(target, operation, run_id, step)
        request = canonical_json({"amount": 100 + i % 9900, "currency": "EUR", "order": f"ord-{i:09d}"})
        worker = workers[i % len(workers)]
        rid = f"re_{rng.getrandbits(64):016x}"
        yield (
            Intent(
                _event_id(rng, t), key, t, 1, target, operation, "default", run_id, step, request,
                hashlib.sha256(request.encode()).hexdigest(), t + DEADLINE_MS, worker,
            ),
            Executed(_event_id(rng, t + 2), key, t + 2, 1, Outcome.OK, None, t, t + 2, None, worker),
            Receipt(
                _event_id(rng, t + 2), key, t + 2, 1, rid, ReceiptSource.CALL,
                canonical_json({"id": rid, "status": "succeeded"}),
            ),
        )  # fmt: skip


def fill(cfg: KafkaConfig, n_effects: int) -> Window:
    """Produce the effects to ``effects.events`` (timestamp = at_ms) and wait for every delivery."""
    codec = default_codec()
    span = n_effects * STEP_MS
    base = now_ms() - span - 10 * 60 * 1000  # all in the past: every deadline passed, nothing stuck
    p = bare_producer(cfg)
    topic = cfg.topics.events
    headers: dict[type, Headers] = {
        cls: [(HEADER, codec.schema_name(cls).encode())] for cls in (Intent, Executed, Receipt)
    }
    errors: list[str] = []

    def report(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    n = 0
    last = base
    for effect in _effects(n_effects, base, seed=n_effects):
        for e in effect:
            value = codec.encode(e, validate=False)  # built from typed values here
            while True:
                try:
                    p.produce(
                        topic, key=e.effect_id.encode(), value=value, headers=headers[type(e)],
                        timestamp=e.at_ms, on_delivery=report,
                    )  # fmt: skip
                    break
                except BufferError:
                    p.poll(0.05)
            n += 1
            last = e.at_ms
        if n % 3000 == 0:
            p.poll(0)
    deadline = time.monotonic() + FLUSH_TIMEOUT
    while (left := p.flush(1.0)) > 0:
        if time.monotonic() > deadline:  # message.timeout.ms is 0: librdkafka would retry forever
            raise TimeoutError(f"{left} events still undelivered {FLUSH_TIMEOUT:.0f} s after the last produce")
    if errors:
        raise RuntimeError(f"{len(errors)} events not delivered: {errors[:3]}")
    return Window(base, base + span, last, n_effects, n)


# -- the three measurements ------------------------------------------------------------------------


@dataclass
class Timed:
    seconds: float  # wall
    cpu_s: float  # CPU of the process (every thread: librdkafka's too)


def raw_replay(cfg: KafkaConfig, start_ms: int, timeout: float) -> tuple[int, Timed]:
    """(events, time) of a bare consumer: offsets_for_times, assign, consume to the end offsets,
    decode every value. It asks ``consume`` for at most the records still due, so the last call
    returns as soon as they are there (a call for more waits out its whole timeout)."""
    decode = default_codec().decode
    topic = cfg.topics.events
    t0, c0 = time.perf_counter(), time.process_time()
    c = Consumer(
        cfg.confluent(
            **{
                "group.id": f"bench-audit-raw-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                **FETCH,
            }
        )
    )
    try:
        parts = range(cfg.partitions)
        starts = c.offsets_for_times([TopicPartition(topic, p, start_ms) for p in parts], timeout=10)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        assign = [tp for tp in starts if 0 <= tp.offset < ends[tp.partition]]
        left = sum(ends[tp.partition] - tp.offset for tp in assign)
        remaining = {tp.partition for tp in assign}
        c.assign(assign)
        n = 0
        deadline = time.monotonic() + timeout
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw replay read {n} events in {timeout:.0f} s")
            for m in c.consume(max(1, min(10_000, left - n)), 1.0):
                if m.error() is not None:
                    raise RuntimeError(f"raw replay: {m.error()}")
                p, off = m.partition() or 0, m.offset() or 0
                if p not in remaining or off >= ends[p]:
                    continue
                decode(m.value())
                n += 1
                if off >= ends[p] - 1:
                    remaining.discard(p)
        return n, Timed(time.perf_counter() - t0, time.process_time() - c0)
    finally:
        c.close()


def in_process(cfg: KafkaConfig, w: Window) -> tuple[Any, Timed]:
    """(report, time) of the audit fold over the window, in this process."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    report = audit(replay_events(cfg, w.start_ms, to_ms=w.end_ms, build=False), w.start_ms, w.end_ms, now_ms())
    return report, Timed(time.perf_counter() - t0, time.process_time() - c0)


@dataclass
class ChildRun:
    seconds: float  # spawn to exit
    cpu_s: float  # user + system CPU of the child (wait4)
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mb: float | None  # VmHWM at the last sample before it exited
    samples: list[tuple[float, float]]  # (seconds since spawn, VmRSS MB)


def run_child(args: list[str], timeout: float, sample_s: float = 0.02) -> ChildRun:
    """Run ``python ARGS`` in the repo: wall time, CPU time, and its memory from /proc/<pid>/status
    every ``sample_s`` until it exits. The peak is VmHWM at the last sample (a high-water mark: only
    the last few ms can be missed). Not ``wait4``'s ru_maxrss: a child forked from this process starts
    with this process's resident size, and the kernel keeps that as the child's maximum across exec."""
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=err)
        ended: dict[str, Any] = {}

        def reap() -> None:
            _, status, usage = os.wait4(proc.pid, 0)
            ended["t"] = time.perf_counter()
            ended["status"], ended["usage"] = status, usage

        waiter = threading.Thread(target=reap, daemon=True, name="bench-audit-wait4")
        waiter.start()
        samples: list[tuple[float, float]] = []
        hwm: float | None = None
        next_sample = 0.0
        try:
            while waiter.is_alive():
                now = time.perf_counter() - t0
                try:
                    r = rss_mb(proc.pid)
                    hwm = r.get("VmHWM", hwm)
                    if "VmRSS" in r and now >= next_sample:
                        samples.append((round(now, 2), round(r["VmRSS"], 1)))
                        next_sample = now + 0.1
                except OSError:
                    pass
                if now > timeout:
                    raise TimeoutError(f"{' '.join(args[:4])} ... did not end in {timeout:.0f} s")
                waiter.join(sample_s)
        finally:
            if waiter.is_alive():  # timed out or interrupted: do not leave the child behind
                proc.kill()
                waiter.join(10)
        proc.returncode = os.waitstatus_to_exitcode(ended["status"])  # reaped by wait4, not by Popen
        usage = ended["usage"]
        out.seek(0)
        err.seek(0)
        return ChildRun(
            ended["t"] - t0, usage.ru_utime + usage.ru_stime, proc.returncode, out.read().decode(),
            err.read().decode(), hwm, samples,
        )  # fmt: skip


def cli_audit(cfg: KafkaConfig, start_ms: int, end_ms: int, timeout: float) -> tuple[dict[str, Any], ChildRun]:
    r = run_child(
        ["-m", "effect_ledger", "audit", "--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix,
         "--from", str(start_ms), "--to", str(end_ms), "--json", "--report-only"],
        timeout,
    )  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"effects audit exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout), r


def check_report(what: str, events: int, undecodable: int, passed: bool, effects: int, w: Window) -> None:
    if events != w.events or undecodable or effects != w.effects or not passed:
        raise RuntimeError(
            f"{what}: counted {events} of {w.events} events ({undecodable} undecodable), "
            f"{effects} of {w.effects} effects, checks {'passed' if passed else 'FAILED'}"
        )


# -- the memory probe ------------------------------------------------------------------------------

# A child process that runs the fold as the command does, with a progress callback that records the
# events folded so far and VmRSS (with tracemalloc: the Python heap) after each consumed batch. At
# the last batch every event is folded and librdkafka's queue is empty; malloc_trim there and before
# the replay hands freed C memory back, so the difference is what the fold keeps.
_PROBE = r"""
import ctypes, json, sys, time
a = json.loads(sys.argv[1])
if a["trace"]:
    import tracemalloc
    tracemalloc.start()
from effect_ledger.ops.audit import audit
from effect_ledger.ops.sources import replay_events
from effect_ledger.streams.config import KafkaConfig

try:
    trim = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):
    trim = lambda _pad: 0

def rss():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) / 1024 for k, v in (ln.split(":", 1) for ln in f) if k in ("VmRSS", "VmHWM")}

def heap():
    return tracemalloc.get_traced_memory()[0] / 2**20 if a["trace"] else None

samples, end = [], {}
def progress(done, total):
    samples.append((done, rss()["VmRSS"], heap()))
    if done == total:
        trim(0)
        end.update(rss=rss()["VmRSS"], heap=heap(), done=done)

cfg = KafkaConfig.from_env(bootstrap=a["bootstrap"], prefix=a["prefix"])
trim(0)
before = {"rss": rss()["VmRSS"], "heap": heap()}
records = replay_events(cfg, a["from"], progress, a["to"], build=False)
report = audit(records, a["from"], a["to"], int(time.time() * 1000))
print(json.dumps({"before": before, "end": end, "samples": samples, "events": report.events,
                  "VmHWM": rss()["VmHWM"]}))
"""


def memory_probe(cfg: KafkaConfig, start_ms: int, w: Window, *, trace: bool, timeout: float) -> dict[str, Any]:
    """Run the probe from ``start_ms`` (an effect's first intent) to the window's end; the growth in
    MB per 100,000 effects (of RSS, or with ``trace`` of the Python heap) from before the replay to
    its last batch, and the RSS samples."""
    arg = {"bootstrap": cfg.bootstrap, "prefix": cfg.prefix, "from": start_ms, "to": w.end_ms, "trace": trace}
    r = run_child(["-c", _PROBE, json.dumps(arg)], timeout)
    if r.returncode != 0:
        raise RuntimeError(f"memory probe exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    d: dict[str, Any] = json.loads(r.stdout)
    effects = (w.end_ms - start_ms) // STEP_MS
    if d["events"] != effects * EVENTS_PER_EFFECT or d["end"].get("done") != d["events"]:
        raise RuntimeError(f"memory probe counted {d['events']} events (expected {effects * EVENTS_PER_EFFECT})")
    which = "heap" if trace else "rss"
    d["effects"] = effects
    d["MB_per_100k_effects"] = (d["end"][which] - d["before"][which]) / effects * 100_000
    d["seconds"] = r.seconds
    return d


def _thin(samples: list[Any], keep: int = 60) -> list[Any]:
    """About ``keep`` of the samples, the last one included."""
    out = samples[:: max(1, len(samples) // keep)]
    return out + samples[-1:] if samples and out[-1] is not samples[-1] else out


# -- the benchmark ---------------------------------------------------------------------------------


def _extras(inproc: Metric, cli: Metric, w: Window, fixed: list[float], cpu: dict[str, list[float]]) -> None:
    fixed_s = min(fixed)
    cli_s = statistics.median(w.events / x for x in cli.runs)
    cli.extra = {
        "seconds_median": cli_s,
        "fixed_cost_s": fixed,
        "events_per_s_without_fixed_cost": w.events / (cli_s - fixed_s),
        "cpu_us_per_event": cpu["cli"],
        "note": f"{cli_s:.2f} s, of which {fixed_s:.2f} s start-up/imports/broker (empty window): "
        f"{fmt(w.events / (cli_s - fixed_s))} events/s without it",
    }
    if not inproc.runs:
        return
    inproc.extra = {
        "seconds": [round(w.events / x, 3) for x in inproc.runs],
        "cpu_us_per_event": cpu["in-process"],
        "raw_cpu_us_per_event": cpu["raw"],
        "note": f"CPU per event: audit {fmt(statistics.median(cpu['in-process']))} us, "
        f"raw {fmt(statistics.median(cpu['raw']))} us (all threads)",
    }


def run(ctx: Context) -> BenchResult:
    n = int(os.environ.get(SIZE_ENV) or ctx.size(1_000_000, 100_000))
    n_effects = math.ceil(n / EVENTS_PER_EFFECT)
    timeout = max(120.0, n / 5000)  # seconds for any one replay
    cfg = ctx.kafka("audit")
    t = time.perf_counter()
    w = fill(cfg, n_effects)
    fill_s = time.perf_counter() - t
    wm = Watermarks(cfg, cfg.topics.events)
    try:
        on_topic = wm.total()
    finally:
        wm.close()
    if on_topic != w.events:
        raise RuntimeError(f"{on_topic} of {w.events} events on {cfg.topics.events}")
    ctx.progress(
        f"audit: {w.events:,} events ({w.effects:,} effects over {(w.end_ms - w.start_ms) / 1000:.0f} s of "
        f"event time) written in {fill_s:.1f} s ({fmt(w.events / fill_s)} events/s)"
    )
    info: dict[str, Any] = {
        "events": w.events,
        "effects": w.effects,
        "events_per_effect": EVENTS_PER_EFFECT,
        "window_ms": [w.start_ms, w.end_ms],
        "fill_s": round(fill_s, 2),
        "fill_events_per_s": round(w.events / fill_s),
        "partitions": cfg.partitions,
    }

    # The command's fixed cost: Python start-up, imports, the broker handshake and the offset
    # look-ups of an empty window (after the last event: nothing to replay).
    empty_from = w.last_event_ms + 60_000
    fixed: list[float] = []
    for _ in range(2):
        doc, r = cli_audit(cfg, empty_from, empty_from + 60_000, timeout)
        if doc["events"] != 0:
            raise RuntimeError(f"the empty window counted {doc['events']} events")
        fixed.append(round(r.seconds, 3))
    fixed_s = min(fixed)
    ctx.progress(f"audit: the command on an empty window takes {fixed_s:.2f} s (start-up, imports, broker)")

    raw_what = "bare consumer from offsets_for_times(start) to the end offsets, codec.decode of every value"
    inproc = Metric(
        "audit in-process: audit(replay_events(...))", "events/s", [], higher_is_better=True,
        target=TARGET_EVENTS_PER_S, ratio_target=TARGET_RATIO, raw_what=raw_what,
    )  # fmt: skip
    cli = Metric("`effects audit --json` (wall, start-up incl.)", "events/s", [], True, raw_what=raw_what)
    peak = Metric("`effects audit` peak RSS (VmHWM)", "MB", [], higher_is_better=False)
    cpu: dict[str, list[float]] = {"raw": [], "in-process": [], "cli": []}  # CPU us per event
    cli_runs: list[dict[str, Any]] = []
    reps = min(ctx.reps, MAX_REPS)
    for rep in range(reps):
        got: dict[str, float] = {}
        order: tuple[str, ...] = ("raw", "in-process", "cli") if rep % 2 == 0 else ("cli", "in-process", "raw")
        if w.events > PROBE_MAX_EVENTS:  # a big window: the command (its peak RSS) and the raw limit only
            order = tuple(x for x in order if x != "in-process")
        for which in order:
            if which == "raw":
                count, tm = raw_replay(cfg, w.start_ms, timeout)
                if count != w.events:
                    raise RuntimeError(f"raw replay read {count} of {w.events} events")
                secs, cpu_s = tm.seconds, tm.cpu_s
            elif which == "in-process":
                report, tm = in_process(cfg, w)
                check_report(
                    "in-process audit", report.events, report.undecodable, report.passed,
                    sum(t.effects for t in report.targets), w,
                )  # fmt: skip
                del report
                secs, cpu_s = tm.seconds, tm.cpu_s
            else:
                doc, r = cli_audit(cfg, w.start_ms, w.end_ms, timeout)
                check_report(
                    "effects audit", doc["events"], doc["undecodable"], doc["passed"],
                    sum(t["effects"] for t in doc["targets"]), w,
                )  # fmt: skip
                secs, cpu_s = r.seconds, r.cpu_s
                if r.peak_rss_mb is None:
                    raise RuntimeError("no VmHWM sample of the command")
                peak.runs.append(r.peak_rss_mb)
                cli_runs.append(
                    {"seconds": round(r.seconds, 3), "peak_rss_mb": r.peak_rss_mb,
                     "rss_samples": _thin(r.samples)}
                )  # fmt: skip
            got[which] = w.events / secs
            cpu[which].append(round(cpu_s / w.events * 1e6, 2))
        if "in-process" in got:
            inproc.runs.append(got["in-process"])
            inproc.raw_limit_runs.append(got["raw"])
        cli.runs.append(got["cli"])
        cli.raw_limit_runs.append(got["raw"])
        ip = got.get("in-process")
        ip_ratio = f"{ip / got['raw']:.2f}" if ip else "-"
        ctx.progress(
            f"audit rep {rep + 1}/{reps}: in-process {fmt(ip) if ip else '-'} events/s (ratio "
            f"{ip_ratio}), command {fmt(got['cli'])} events/s (ratio "
            f"{got['cli'] / got['raw']:.2f}, peak RSS {fmt(peak.runs[-1])} MB), raw {fmt(got['raw'])} events/s; "
            f"CPU us/event: in-process {cpu['in-process'][-1] if ip else '-'}, command {cpu['cli'][-1]}, "
            f"raw {cpu['raw'][-1]}"
        )

    peak.extra = {
        "effects": w.effects,
        "events": w.events,
        "MB_per_100k_effects_of_peak": peak.median / w.effects * 100_000,
        "cli_runs": cli_runs,
    }
    _extras(inproc, cli, w, fixed, cpu)
    if w.events > PROBE_MAX_EVENTS:
        ctx.progress(f"audit: in-process run and memory probes skipped above {PROBE_MAX_EVENTS:,} events; "
                     f"command peak RSS {fmt(peak.median)} MB")  # fmt: skip
        ctx.drop(cfg)
        return BenchResult("audit_replay", "ran", [cli, peak], info=info)
    ctx.progress("audit: memory probes (RSS of the whole replay; the Python heap with tracemalloc on a part)")
    probe = memory_probe(cfg, w.start_ms, w, trace=False, timeout=timeout)
    part = min(w.effects, HEAP_PROBE_EFFECTS)
    heap = memory_probe(cfg, w.end_ms - part * STEP_MS, w, trace=True, timeout=timeout)
    growth = Metric(
        "audit RSS growth per 100k effects", "MB", [probe["MB_per_100k_effects"]], higher_is_better=False,
        extra={
            "how": (
                "child process running audit(replay_events(...)) over the window: VmRSS at the last consumed "
                "batch minus VmRSS before the replay (both after malloc_trim), per 100,000 effects"
            ),
            "rss_before_end_MB": [probe["before"]["rss"], probe["end"]["rss"]],
            "probe_peak_VmHWM_MB": probe["VmHWM"],
            "python_heap_MB_per_100k_effects": heap["MB_per_100k_effects"],
            "python_heap_effects": heap["effects"],
            "rss_samples_events_MB": [(s[0], round(s[1], 1)) for s in _thin(probe["samples"])],
            "note": f"Python heap (tracemalloc, {heap['effects']:,} effects): "
            f"{fmt(heap['MB_per_100k_effects'])} MB per 100k effects",
        },
    )  # fmt: skip
    ctx.progress(
        f"audit: RSS growth {fmt(growth.median)} MB per 100k effects (Python heap "
        f"{fmt(heap['MB_per_100k_effects'])} MB); command peak RSS {fmt(peak.median)} MB"
    )
    ctx.drop(cfg)
    return BenchResult("audit_replay", "ran", [inproc, cli, peak, growth], info=info)
