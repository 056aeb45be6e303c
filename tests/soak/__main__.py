"""``python -m tests.soak`` (``make soak``): effect-ledger under steady load, with failures.

Two agent hosts (``tests.soak.agent``: separate ledger files and worker identities, Kafka mode
through the SDK) execute refunds at ``--rate`` effects/s in total against three destinations
(``tests.soak.destinations``: honours keys + lookup, lookup only, neither), some of whose calls are
lost or too slow; two ``effects worker`` processes fold the events; one ``effects reconcile``
settles what became uncertain. In the middle: each agent host is killed -9 and restarted (its calls
in flight pass their deadlines with no outcome), a worker is killed -9 and restarted, and the broker
is restarted (``scripts/kafka.sh down`` + ``up``, the repo's own broker only; ``--no-broker-restart``
skips it). Then the agents stop, the system drains, and the report is written to ``--out``:
``soak-report.json``, ``soak-report.md`` and ``soak.png`` (lag and detection latency over time).
Exit status 0 when lost, doubled and undetected are all 0 (PASS), 1 when one is not (FAIL), 3 when
effects were still open while the workers had a backlog to fold (INCONCLUSIVE: ``tests.soak.report``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from effect_ledger.processors.processor import ProcessorSettings
from effect_ledger.processors.supervise import Processor, Reconcilers
from effect_ledger.streams.admin import BrokerUnavailable, wait_ready
from effect_ledger.streams.config import KafkaConfig
from tests.bench.common import CPU_COUNT, ROOT, Context, Watermarks, fmt
from tests.bench.plots import Panel, Series, draw
from tests.bench.processor import wait_all_ready
from tests.soak import report
from tests.soak.destinations import declaration
from tests.soak.observe import LagSampler, TopicObserver

RECONCILERS_GROUP = "effect-ledger-reconcilers"  # effects reconcile's default --group
DRAIN_CAP_S = 1800.0


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="minutes of load [10]")
    p.add_argument("--rate", type=float, default=500.0, help="effects per second, both hosts together [500]")
    p.add_argument("--out", default="soak-report", help="folder of the report and the plot [soak-report]")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap [KAFKA_BOOTSTRAP or 127.0.0.1:9092]")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the soak's topics [6]")
    p.add_argument("--no-broker-restart", action="store_true",
                   help="skip the broker restart (for a broker this checkout did not start)")  # fmt: skip
    p.add_argument("--call-timeout", type=float, default=2.0, help="each call's timeout = its deadline, s [2]")
    p.add_argument("--lost", type=float, default=0.005, help="share of calls whose reply is lost [0.005]")
    p.add_argument("--slow", type=float, default=0.005, help="share of calls answered after the timeout [0.005]")
    p.add_argument("--note", default="", help="a line for the report (e.g. what else ran on the machine)")
    p.add_argument("--drain", type=float, default=120.0,
                   help="the drain ends when no effect settled for this many seconds [120]")  # fmt: skip
    return p.parse_args(argv)


class Host:
    """One agent host: a ``tests.soak.agent`` child; each (re)start is a new incarnation."""

    def __init__(self, name: str, wd: Path, common: list[str]) -> None:
        self.name, self.wd, self.common = name, wd, common
        self.incarnation = -1
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        self.incarnation += 1
        log = self.wd / f"agent-{self.name}-{self.incarnation}.log"
        self.logs.append(log)
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.soak.agent", "--db", str(self.wd / f"host-{self.name}.db"),
                 "--host", self.name, "--incarnation", str(self.incarnation), *self.common],
                stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 90) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def counts(self) -> Counter[str]:
        """The last count line of every incarnation, summed."""
        total: Counter[str] = Counter()
        for log in self.logs:
            last: dict[str, Any] = {}
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"started"' in line:
                    last = json.loads(line)
            skip = ("incarnation", "in_flight")
            total.update({k: v for k, v in last.items() if type(v) is int and k not in skip})
        return total


def _broker(action: str) -> float:
    t = time.monotonic()
    r = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), action], capture_output=True, text=True,
                       timeout=180, check=False)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"scripts/kafka.sh {action} failed: {(r.stderr or r.stdout).strip()[-500:]}")
    return time.monotonic() - t


def _folded(workers: list[Processor], partitions: int) -> int | None:
    """Events folded, from the workers' health views (per partition the furthest any reports);
    None while a partition has no live owner that reports it (a worker killed, a rebalance)."""
    best: dict[str, int] = {}
    for w in workers:
        h = w.health() or {}
        for p, off in (h.get("processed") or {}).items():
            best[p] = max(best.get(p, -1), int(off))
    return sum(o + 1 for o in best.values()) if len(best) == partitions else None


def _keep_logs(wd: Path, dest: Path, limit: int = 1 << 20) -> None:
    """The services' and agents' logs (the last ``limit`` bytes of each) next to the report: the
    work folder is deleted at the end."""
    dest.mkdir(parents=True, exist_ok=True)
    for log in wd.rglob("*.log"):
        with open(log, "rb") as f:
            f.seek(max(0, log.stat().st_size - limit))
            (dest / log.name).write_bytes(f.read())


def _backlog(cfg: KafkaConfig, workers: list[Processor]) -> int | None:
    """Events on effects.events the workers have not folded (None: not every partition reported)."""
    folded = _folded(workers, cfg.partitions)
    if folded is None:
        return None
    wm = Watermarks(cfg, cfg.topics.events)
    try:
        return max(0, wm.total() - folded)
    finally:
        wm.close()


def _executions(urls: dict[str, str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, url in urls.items():
        with urllib.request.urlopen(f"{url}/_admin/refunds", timeout=60) as r:
            refunds = json.loads(r.read())["refunds"]
        per_key: dict[str, int] = defaultdict(int)
        for ref in refunds:
            per_key[ref["idempotency_key"] or f"(no key) {ref['id']}"] += 1
        out[name] = dict(per_key)
    return out


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    cfg0 = KafkaConfig.from_env(bootstrap=a.bootstrap)
    restart_broker = not a.no_broker_restart
    if restart_broker:
        port = os.environ.get("KAFKA_PORT", "9092")
        st = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "status"], capture_output=True, check=False)
        if st.returncode != 0 or not cfg0.bootstrap.endswith(f":{port}"):
            print(f"soak: the broker restart needs the broker scripts/kafka.sh runs on :{port} (make soak starts "
                  f"one); {cfg0.bootstrap} is not it: pass --no-broker-restart", file=sys.stderr)  # fmt: skip
            return 2
    try:
        wait_ready(cfg0, timeout=15)
    except BrokerUnavailable as e:
        print(f"soak: no Kafka broker: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(quick=False, reps=1, bootstrap=cfg0.bootstrap, partitions=a.partitions,
                  printer=lambda m: print(m, flush=True))  # fmt: skip
    started = datetime.now(UTC).isoformat(timespec="seconds")
    timeline: list[dict[str, Any]] = []
    try:
        return _run(a, ctx, out, restart_broker, started, timeline)
    except KeyboardInterrupt:
        print("soak: interrupted", file=sys.stderr)
        return 130
    finally:
        ctx.cleanup()


def _run(a: argparse.Namespace, ctx: Context, out: Path, restart_broker: bool, started: str,
         timeline: list[dict[str, Any]]) -> int:  # fmt: skip
    cfg = ctx.kafka("soak")
    wd = ctx.workdir("soak")
    dest = subprocess.Popen([sys.executable, "-m", "tests.soak.destinations", "--lost", str(a.lost),
                             "--slow", str(a.slow), "--slow-delay", str(a.call_timeout + 1.5)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                            stderr=open(wd / "destinations.log", "ab"))  # noqa: SIM115  # fmt: skip
    ctx.on_cleanup(lambda: (dest.stdin.close() if dest.stdin else None, dest.wait(30)))
    assert dest.stdout is not None
    urls: dict[str, str] = json.loads(dest.stdout.readline())
    targets = wd / "targets.toml"
    targets.write_text(declaration(urls))
    workers = [Processor(cfg, wd / f"worker-{i}", targets=targets) for i in (1, 2)]
    for w in workers:
        w.start()
        ctx.on_cleanup(w.stop)
    wait_all_ready(workers, cfg.partitions)
    rec = Reconcilers(cfg, wd, ["--targets", str(targets)]).start()
    ctx.on_cleanup(rec.stop)
    load_start = round(os.getloadavg()[0], 2)
    t0 = time.monotonic()
    t0_ms = time.time_ns() // 1_000_000
    observer = TopicObserver(cfg)
    observer.start()
    ctx.on_cleanup(observer.stop.set)
    lag = LagSampler(cfg, f"{cfg.prefix}{ProcessorSettings().app_id}", f"{cfg.prefix}{RECONCILERS_GROUP}", t0,
                     lambda: _folded(workers, cfg.partitions))  # fmt: skip
    lag.start()
    ctx.on_cleanup(lag.stop.set)

    def mark(what: str) -> None:
        timeline.append({"t_s": round(time.monotonic() - t0, 1), "what": what})
        ctx.progress(what)

    common = ["--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix, "--partitions", str(cfg.partitions),
              "--targets", str(targets), "--urls", json.dumps(urls), "--rate", str(a.rate / 2),
              "--timeout", str(a.call_timeout)]  # fmt: skip
    hosts = [Host(n, wd, common) for n in ("a", "b")]
    for h in hosts:
        h.start()
        ctx.on_cleanup(h.kill)
    mark(f"load starts: 2 agent hosts at {a.rate / 2:g} effects/s each, 2 workers, 1 reconciler")
    duration = a.minutes * 60
    restart_after = max(5.0, duration * 0.02)
    down: set[int] = set()  # workers killed on purpose, not yet restarted
    steps: list[tuple[float, str, Any]] = [
        (0.30, "kill -9 agent host a (restarted at once)", lambda: (hosts[0].kill(), hosts[0].start())),
        (0.40, "kill -9 worker 1", lambda: (down.add(0), workers[0].kill())),
        (0.40 + restart_after / duration, "worker 1 restarted", lambda: (down.discard(0), workers[0].start())),
        (0.50, "kill -9 agent host b (restarted at once)", lambda: (hosts[1].kill(), hosts[1].start())),
    ]
    if restart_broker:
        steps.append((0.60, "broker restart", lambda: mark(
            f"broker down in {_broker('down'):.1f} s, up again in {_broker('up'):.1f} s")))  # fmt: skip
    steps.sort(key=lambda s: s[0])
    unexpected: list[str] = []
    next_progress = 30.0
    while (elapsed := time.monotonic() - t0) < duration:
        while steps and elapsed >= steps[0][0] * duration:
            _, what, act = steps.pop(0)
            mark(what)
            act()
        for i, w in enumerate(workers):
            if not w.alive and i not in down:
                unexpected.append(f"{elapsed:.0f} s: worker {i + 1} exited ({w.proc.returncode if w.proc else '?'})")
                mark(f"worker {i + 1} exited on its own: restarted")
                w.start()
        for h in hosts:
            if h.proc is not None and h.proc.poll() is not None:
                unexpected.append(f"{elapsed:.0f} s: agent host {h.name} exited ({h.proc.returncode})")
                mark(f"agent host {h.name} exited on its own: restarted")
                h.start()
        if not rec.alive:
            unexpected.append(f"{elapsed:.0f} s: the reconciler exited")
            mark("the reconciler exited on its own: restarted")
            rec.start()
        if elapsed >= next_progress:
            s = lag.samples[-1] if lag.samples else {}
            ctx.progress(f"{len(observer.seen):,} effects seen, {observer.open_effects():,} open; workers lag "
                         f"{s.get('workers_lag')} committed, {s.get('workers_unfolded')} unfolded; reconcilers lag "
                         f"{s.get('reconcilers_lag')}")  # fmt: skip
            next_progress += 30
        time.sleep(0.5)
    mark("load stops (agents finish their calls in flight)")
    for h in hosts:
        h.stop()
    load_s = time.monotonic() - t0
    # The drain lasts while effects keep settling: it ends when none is open, when none settled for
    # --drain seconds, or after DRAIN_CAP_S (workers far behind fold a long backlog first).
    drain_cap = time.monotonic() + DRAIN_CAP_S
    best, stalled_since = observer.open_effects(), time.monotonic()
    while (still := observer.open_effects()) and time.monotonic() < drain_cap:
        if still < best:
            best, stalled_since = still, time.monotonic()
        elif time.monotonic() - stalled_since > a.drain:
            break
        time.sleep(1)
    backlog = _backlog(cfg, workers)
    mark(f"drained: {observer.open_effects()} effects still open, {backlog} events not folded yet")
    time.sleep(2)  # the last state records in flight to the observer (no verdict rests on it)
    executions = _executions(urls)
    observer.stop.set()
    lag.stop.set()
    observer.join(10)
    lag.join(10)
    seen = observer.snapshot()
    agents = sum((h.counts() for h in hosts), Counter())
    grace = ProcessorSettings().grace_ms
    r = report.compute(seen, executions, lag.samples, t0_ms=t0_ms, grace_ms=grace, backlog=backlog)
    meta = {
        "started": started, "minutes": a.minutes, "rate": a.rate, "partitions": cfg.partitions,
        "cpu_count": CPU_COUNT, "load_s": round(load_s, 1),
        "achieved_rate": (agents["started"] - agents["behind"]) / load_s if load_s else None,
        "agents": dict(agents), "timeline": timeline, "unexpected_exits": unexpected,
        "broker_restart": restart_broker, "call_timeout_s": a.call_timeout, "lost_share": a.lost,
        "slow_share": a.slow, "loadavg_1m_start": load_start, "loadavg_1m_end": round(os.getloadavg()[0], 2),
        "observer_error": repr(observer.error) if observer.error else None,
        "note": " ".join(x for x in (a.note, "" if restart_broker else "The broker restart was skipped "
                                     "(--no-broker-restart).") if x),
    }  # fmt: skip
    _keep_logs(wd, out / "logs")
    png = _plot(out / "soak.png", r, lag.samples, seen, t0_ms, timeline, meta)
    (out / "soak-report.json").write_text(json.dumps({"meta": meta, "report": r}, indent=2, default=str))
    (out / "soak-report.md").write_text(report.markdown(r, meta, png.name))
    ok = report.verdict(r)
    det = r["detection_ms"]
    print(f"soak {report.outcome(r)}: {r['effects']:,} effects ({fmt(meta['achieved_rate'])}/s), "
          f"lost {r['lost']}, doubled {r['doubled']}, passed deadlines {r['passed_deadline']:,} "
          f"(detected {r['detected']:,}), detection p50 {fmt(det['p50'])} ms p99 {fmt(det['p99'])} ms; "
          f"report in {out}/soak-report.md, plot {png}")  # fmt: skip
    return 0 if ok else {"FAIL": 1}.get(report.outcome(r), 3)


def _plot(path: Path, r: dict[str, Any], samples: list[dict[str, Any]], seen: dict[str, report.Seen], t0_ms: int,
          timeline: list[dict[str, Any]], meta: dict[str, Any]) -> Path:  # fmt: skip
    marks = [(t["t_s"], t["what"][:40]) for t in timeline]
    dots = sorted(
        ((report.latency_start(e) - t0_ms) / 1000, e.uncertain_ms - report.latency_start(e))
        for e in seen.values() if report.passed_deadline(e) and e.uncertain_ms is not None
    )  # fmt: skip
    minutes = r["detection_per_minute"]
    mid = [m["minute"] * 60 + 30 for m in minutes]
    return draw(path, f"effect-ledger soak: {meta['rate']:g} effects/s for {meta['minutes']:g} min",
                "seconds since the load started", [
        Panel("consumer-group lag (records)", [
            Series("workers on effects.events (committed)", [s["t_s"] for s in samples],
                   [s["workers_lag"] for s in samples]),
            Series("workers on effects.events (folded, health view)", [s["t_s"] for s in samples],
                   [s.get("workers_unfolded") for s in samples], "--"),
            Series("reconciler on effects.uncertain", [s["t_s"] for s in samples],
                   [s["reconcilers_lag"] for s in samples]),
        ], marks),
        Panel("deadline -> uncertain (ms)", [
            Series("each passed deadline", [d[0] for d in dots], [d[1] for d in dots], "."),
            Series("p50 per minute", mid, [m["p50"] for m in minutes], "o-"),
            Series("p99 per minute", mid, [m["p99"] for m in minutes], "s-"),
        ], marks, log_y=True),
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
