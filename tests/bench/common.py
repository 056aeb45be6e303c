"""What every benchmark shares: the run context (sizes, repetitions, progress output, cleanup of
topics, processes and folders), the result records, statistics, synthetic events, and small Kafka
helpers (fresh topic sets, a bare producer, watermarks, resident memory of a process)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from effect_ledger.core.model import Executed, Intent, Outcome, Receipt, ReceiptSource
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.admin import delete_topics, ensure_topics, list_topics
from effect_ledger.streams.codec import HEADER, default_codec
from effect_ledger.streams.config import KafkaConfig

ROOT = Path(__file__).resolve().parents[2]
N = TypeVar("N", int, float)
Headers = list[tuple[str, str | bytes | None]]
CPU_COUNT = os.cpu_count() or 1


# -- results ---------------------------------------------------------------------------------------


@dataclass
class Metric:
    """One figure of a benchmark: the median over ``runs``, its raw limit, and the target.

    ``higher_is_better``: throughputs (target is a floor) vs latencies/overheads/memory (a ceiling).
    ``ratio`` is value / raw limit (for a throughput: the fraction of the raw limit reached; for a
    latency or overhead: how many raw-limit units it costs)."""

    metric: str
    unit: str
    runs: list[float]
    higher_is_better: bool
    target: float | None = None
    raw_limit: float | None = None
    raw_limit_runs: list[float] = field(default_factory=list)
    raw_what: str = ""
    # A second target on the ratio (relay: >= 0.5 of raw); checked like ``target``: a floor for a
    # throughput, a ceiling for a latency (sdk_peers: SyncLedger <= 1.25 x Ledger).
    ratio_target: float | None = None
    # Per-repetition ratios to the raw limit measured in the same repetition: when given, ``ratio``
    # is their median (steadier on a shared machine than a ratio of two medians).
    ratio_runs: list[float] = field(default_factory=list)
    percentiles: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else float("nan")

    @property
    def raw(self) -> float | None:
        """The raw limit: given, or the median of the raw runs measured beside the runs."""
        if self.raw_limit is not None:
            return self.raw_limit
        return statistics.median(self.raw_limit_runs) if self.raw_limit_runs else None

    @property
    def ratio(self) -> float | None:
        if self.ratio_runs:
            return statistics.median(self.ratio_runs)
        raw = self.raw
        if not raw or not self.runs:
            return None
        return self.median / raw

    @property
    def target_text(self) -> str:
        parts = []
        op = ">=" if self.higher_is_better else "<="
        if self.target is not None:
            parts.append(f"{op} {fmt(self.target)} {self.unit}")
        if self.ratio_target is not None:
            parts.append(f"{op} {self.ratio_target:g} x raw")
        return " and ".join(parts) or "-"

    @property
    def passed(self) -> bool | None:
        if self.target is None and self.ratio_target is None:
            return None
        ok = True
        if self.target is not None:
            ok = self.median >= self.target if self.higher_is_better else self.median <= self.target
        if self.ratio_target is not None:
            r = self.ratio
            ok = ok and r is not None and (r >= self.ratio_target if self.higher_is_better else r <= self.ratio_target)
        return ok

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "unit": self.unit,
            "median": self.median,
            "runs": self.runs,
            "repetitions": len(self.runs),
            "percentiles": self.percentiles,
            "raw_limit": self.raw,
            "raw_limit_runs": self.raw_limit_runs,
            "raw_limit_is": self.raw_what,
            "ratio": self.ratio,
            **({"ratio_runs": self.ratio_runs} if self.ratio_runs else {}),
            "target": self.target_text,
            "target_value": self.target,
            "ratio_target": self.ratio_target,
            "higher_is_better": self.higher_is_better,
            "pass": self.passed,
            "cpu_count": CPU_COUNT,
            **({"extra": self.extra} if self.extra else {}),
        }


@dataclass
class BenchResult:
    name: str
    status: str  # "ran" | "skipped" | "error"
    metrics: list[Metric] = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        passes = [m.passed for m in self.metrics if m.passed is not None]
        return {
            "name": self.name,
            "status": self.status,
            "note": self.note,
            "seconds": round(self.seconds, 1),
            "pass": (all(passes) if passes else None) if self.status == "ran" else None,
            "cpu_count": CPU_COUNT,
            "info": self.info,
            "metrics": [m.to_json() for m in self.metrics],
        }


class Skip(Exception):
    """Raised by a benchmark that cannot run yet; its message goes into the table."""


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x != x:  # nan
        return "nan"
    a = abs(x)
    if a >= 100_000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def percentile(values: Iterable[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


# -- the run context -------------------------------------------------------------------------------


class Context:
    """Sizes and repetitions of this run, progress output, and everything to clean up at the end."""

    def __init__(self, *, quick: bool, reps: int | None, bootstrap: str, partitions: int, printer: Any) -> None:
        self.quick = quick
        self.reps = reps if reps is not None else (2 if quick else 5)
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.run_id = uuid.uuid4().hex[:8]
        self._print = printer
        self._prefixes: list[str] = []
        self._cleanups: list[Callable[[], None]] = []
        self._dirs: list[Path] = []
        self._t0 = time.monotonic()
        self.shared: dict[str, Any] = {}  # figures one benchmark passes to a later one
        self.options: dict[str, Any] = {}  # per-benchmark options from the command line (--memory-effects, ...)
        self.plots: Path | None = None  # where benchmarks that draw put their PNGs (None: no plots)

    def size(self, full: N, quick: N) -> N:
        return quick if self.quick else full

    def progress(self, msg: str) -> None:
        self._print(f"[{time.monotonic() - self._t0:6.1f}s] {msg}")

    @property
    def tmp_base(self) -> Path:
        return _disk_tmp()

    # Temporary folders on the working disk (never tmpfs): the SQLite files, processor data dirs.
    def workdir(self, name: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix=f"effect-ledger-bench-{name}-", dir=self.tmp_base))
        self._dirs.append(d)
        return d

    def kafka(self, tag: str, *, create: bool = True) -> KafkaConfig:
        """A KafkaConfig with a fresh topic prefix (its topics created unless ``create=False``);
        every topic under the prefix (also faust's changelog and assignor topics) is deleted at the
        end."""
        prefix = f"bench{self.run_id}.{tag}.{uuid.uuid4().hex[:6]}."
        cfg = KafkaConfig.from_env(bootstrap=self.bootstrap, prefix=prefix, partitions=self.partitions)
        self._prefixes.append(prefix)
        if create:
            ensure_topics(cfg)
        return cfg

    def drop(self, cfg: KafkaConfig) -> None:
        """Delete every topic under ``cfg``'s prefix now (big topics should not pile up)."""
        try:
            names = [t for t in list_topics(cfg) if t.startswith(cfg.prefix)]
            delete_topics(cfg, names)
        except Exception as e:
            self.progress(f"could not delete topics under {cfg.prefix}: {e} (retried at the end)")
            return
        if cfg.prefix in self._prefixes:
            self._prefixes.remove(cfg.prefix)

    def on_cleanup(self, fn: Callable[[], None]) -> None:
        self._cleanups.append(fn)

    def cleanup(self) -> None:
        for fn in reversed(self._cleanups):
            with contextlib.suppress(Exception):
                fn()
        self._cleanups.clear()
        if self._prefixes:
            try:
                cfg = KafkaConfig.from_env(bootstrap=self.bootstrap)
                names = [t for t in list_topics(cfg) if any(t.startswith(p) for p in self._prefixes)]
                delete_topics(cfg, names)
                if names:
                    self.progress(f"deleted {len(names)} bench topics")
            except Exception as e:  # never hide the results behind a cleanup error
                self.progress(f"could not delete bench topics: {e}")
            self._prefixes.clear()
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)
        self._dirs.clear()


def _disk_tmp() -> Path:
    """/tmp when it is on the same (non-tmpfs) device as the repo, else a folder in the repo."""
    tmp = Path(tempfile.gettempdir())
    if tmp.stat().st_dev == ROOT.stat().st_dev and fs_type(tmp) not in ("tmpfs", "ramfs"):
        return tmp
    d = ROOT / ".bench-tmp"
    d.mkdir(exist_ok=True)
    return d


def fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", "?"
    p = str(path.resolve())
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1]
            if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, parts[2]
    return kind


def disk_info(path: Path) -> dict[str, Any]:
    st = os.statvfs(path)
    dev = ""
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        best = ""
        for line in f:
            parts = line.split()
            if str(path.resolve()).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, dev = parts[1], parts[0]
    return {"path": str(path), "fs": fs_type(path), "device": dev, "free_gb": round(st.f_bavail * st.f_frsize / 1e9, 1)}


# -- memory ----------------------------------------------------------------------------------------


def rss_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MB, from /proc/<pid>/status."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) / 1024  # kB -> MB
    return out


# -- synthetic events ------------------------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


KEY_PLACEHOLDER = "payments:" + "Z" * 24  # never a hex digit: unique inside every encoded body


class EventFactory:
    """Encoded events of synthetic effects, fast enough for millions: each kind is encoded once with
    the real codec around a placeholder key, and the effect id is patched into the bytes (every
    key has the same length, so Avro's length prefixes stay valid). Event ids repeat across effects,
    which the fold allows (idempotence is per effect). Intents carry a deadline an hour away, so no
    timeout fires while a benchmark runs."""

    def __init__(self, tag: str | None = None) -> None:
        self.codec = default_codec()
        self.tag = (tag or uuid.uuid4().hex[:8])[:8].ljust(8, "0")
        t = now_ms()
        k = KEY_PLACEHOLDER
        request = '{"amount":4800,"currency":"CNY","order":"123"}'
        worker = f"bench-host:12345:987654:{uuid.uuid4().hex[:8]}"
        intent = Intent(
            uuid.uuid4().hex, k, t, 1, "payments", "refund.create", "default", "run-bench", "refund-order-123",
            request, hashlib.sha256(request.encode()).hexdigest(), t + 3_600_000, worker,
        )  # fmt: skip
        executed = Executed(uuid.uuid4().hex, k, t + 1, 1, Outcome.OK, None, t, t + 1, None, worker)
        receipt = Receipt(uuid.uuid4().hex, k, t + 2, 1, "re_123", ReceiptSource.CALL, '{"id":"re_123"}')
        self.kinds = ("Intent", "Executed", "Receipt")
        self._templates = [self.codec.encode(e) for e in (intent, executed, receipt)]
        self._headers: list[Headers] = [
            [(HEADER, self.codec.schema_name(e).encode())] for e in (intent, executed, receipt)
        ]
        self._ph = k.encode()
        for body in self._templates:
            assert body.count(self._ph) == 1, "the placeholder key must occur once per body"

    def key(self, i: int) -> str:
        return f"payments:{self.tag}{i:016x}"

    def bodies(self, i: int, kinds: int = 3) -> list[tuple[bytes, bytes, str, Headers]]:
        """(key, value, kind name, headers) of the first ``kinds`` events of effect ``i``."""
        kb = self.key(i).encode()
        return [(kb, self._templates[j].replace(self._ph, kb), self.kinds[j], self._headers[j]) for j in range(kinds)]

    def check(self) -> None:
        """Decode a patched sample: the bytes must be what the codec itself would accept."""
        for kb, value, _, _ in self.bodies(12345):
            ev = self.codec.decode(value)
            assert ev.effect_id == kb.decode()


# -- Kafka helpers ---------------------------------------------------------------------------------


def bare_producer(cfg: KafkaConfig, **extra: Any) -> Producer:
    """A producer with the relay's settings (``effect_ledger.sdk.kafka.relay.producer_config``)."""
    return Producer(producer_config(cfg, **extra))


def warm_producer(p: Producer, topic: str, timeout: float = 30.0) -> float:
    """Send one record to ``topic`` (not the one measured) and wait for it: the idempotent producer
    has its producer id and connections afterwards. Returns the seconds that took (librdkafka retries
    the producer-id request after 500 ms when the first broker connection is the bootstrap one)."""
    t = time.perf_counter()
    p.produce(topic, key=b"bench-warm-up", value=b"")
    if p.flush(timeout) > 0:
        raise RuntimeError(f"warm-up record to {topic} not delivered in {timeout} s")
    return time.perf_counter() - t


def produce_all(
    p: Producer,
    topic: str,
    records: Iterable[tuple[bytes, bytes, Headers | None]],
    *,
    reports: bool = True,
) -> int:
    """Produce and flush; returns the count. With ``reports`` a delivery callback per record checks
    for failures (and raises); without, the caller checks what arrived (the barest producer loop)."""
    errs: list[str] = []

    def report(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errs.append(str(err))

    cb = report if reports else None
    n = 0
    for key, value, headers in records:
        while True:
            try:
                p.produce(topic, key=key, value=value, headers=headers, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
        if n % 1000 == 0:
            p.poll(0)
    while p.flush(1.0) > 0:
        pass
    if errs:
        raise RuntimeError(f"{len(errs)} records not delivered: {errs[:3]}")
    return n


def _watermark_consumer(cfg: KafkaConfig) -> Consumer:
    return Consumer(
        cfg.confluent(
            **{
                "group.id": f"bench-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
            }
        )
    )


class Watermarks:
    """High watermarks and first/last record timestamps of a topic, without reading it all."""

    def __init__(self, cfg: KafkaConfig, topic: str) -> None:
        self.cfg = cfg
        self.topic = topic
        self._c = _watermark_consumer(cfg)

    def high(self) -> dict[int, int]:
        return {
            p: self._c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10, cached=False)[1]
            for p in range(self.cfg.partitions)
        }

    def total(self) -> int:
        return sum(self.high().values())

    def record_at(self, partition: int, offset: int, timeout: float = 10.0) -> Any:
        self._c.assign([TopicPartition(self.topic, partition, offset)])
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                m = self._c.poll(0.5)
                if m is None or m.error() is not None:
                    continue
                return m
            raise TimeoutError(f"no record at {self.topic}[{partition}]@{offset}")
        finally:
            self._c.unassign()

    def time_span_ms(self) -> tuple[int, int, int]:
        """(earliest timestamp among the first records, latest among the last, record count) over
        every partition, from one snapshot of the watermarks."""
        first, last, count = [], [], 0
        for p in range(self.cfg.partitions):
            lo, hw = self._c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10, cached=False)
            if hw <= lo:
                continue
            count += hw - lo
            first.append(self.record_at(p, lo).timestamp()[1])
            last.append(self.record_at(p, hw - 1).timestamp()[1])
        if not first:
            raise RuntimeError(f"{self.topic} is empty")
        return min(first), max(last), count

    def close(self) -> None:
        self._c.close()


@contextlib.contextmanager
def reader(cfg: KafkaConfig, topic: str, *, from_beginning: bool = True) -> Iterator[Consumer]:
    """A consumer assigned to every partition of ``topic`` (no group membership, no commits)."""
    c = _watermark_consumer(cfg)
    offset = OFFSET_BEGINNING if from_beginning else -1  # OFFSET_END
    c.assign([TopicPartition(topic, p, offset) for p in range(cfg.partitions)])
    try:
        yield c
    finally:
        c.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
