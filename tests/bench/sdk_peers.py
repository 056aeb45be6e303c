"""sdk_peers: the SDK's paths beside the physical limit and beside the peers, in one run.

Per repetition, interleaved (fresh files each time, the same process), sequential N steps each:

* bare SQLite: one-row INSERT+COMMIT through plain ``sqlite3`` at NORMAL and at FULL (WAL);
* ``Ledger.execute`` (async) and ``SyncLedger.execute`` (the sync path every adapter runs on), at
  NORMAL and FULL, per effect (whole cost, not overhead: the call itself is an in-process no-op),
  with its call in a call thread (the default: the deadline can cut it off) and in the caller's
  thread (``inline_calls``);
* a thread round trip: a job handed to an idle thread and its answer back, after the caller has
  worked as long as a ``Ledger.execute`` takes (what the default sync path adds twice a call:
  waking a thread that sleeps, which on a virtual machine is the hypervisor's price);
* 64 concurrent tasks sharing one ``Ledger``, per effect, at NORMAL and FULL;
* a LangGraph step (one node, ``InMemorySaver`` checkpointer, a fresh thread per step) whose node
  makes the call directly, and the same node through ``effect_ledger.langgraph.ledger_effect``.

Each row is checked on its ratio to what it is measured against in the same repetition (the median
of the per-repetition ratios): the machine is shared and noisy, the ratios are what hold.

========================================  ==========================================  ========
row                                       against                                     target
========================================  ==========================================  ========
SyncLedger.execute NORMAL / FULL           Ledger.execute, same durability             <= 1.25
SyncLedger inline_calls NORMAL / FULL      Ledger.execute, same durability             <= 1.25
Ledger.execute FULL                        two bare FULL commits                       <= 1.5
64 concurrent NORMAL, per effect           one bare NORMAL commit                      <= 8.5
64 concurrent FULL, per effect             64 concurrent NORMAL, per effect            <= 1.0
LangGraph node with the adapter            the node without it + one Ledger.execute    <= 1.3
  (and with the adapter over inline_calls)
========================================  ==========================================  ========
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from effect_ledger.core.reconcile import Target
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.sync import SyncLedger
from tests.bench.common import BenchResult, Context, Metric, disk_info, fmt

CONCURRENCY = 64
REQUEST = {"order": "123", "amount": 4800, "currency": "CNY"}
BODY = b"\xc3\x01" + b"x" * 290  # about an encoded Intent
WARM = 100
DURABILITIES = ("NORMAL", "FULL")


async def _acall(key: str) -> dict[str, Any]:
    return {"id": "re_" + key[-12:]}


def _scall(key: str) -> dict[str, Any]:
    return {"id": "re_" + key[-12:]}


def bare_commit_us(path: Path, durability: str, n: int) -> float:
    """One-row INSERT+COMMIT through plain sqlite3 (WAL, ``synchronous=durability``), us each."""
    c = sqlite3.connect(str(path), isolation_level=None)
    try:
        c.execute("PRAGMA journal_mode=WAL")
        c.execute(f"PRAGMA synchronous={durability}")
        c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT NOT NULL, body BLOB NOT NULL)")
        for i in range(20):
            c.execute("INSERT INTO t (k, body) VALUES (?, ?)", (f"w{i}", BODY))
        t0 = time.perf_counter()
        for i in range(n):
            c.execute("INSERT INTO t (k, body) VALUES (?, ?)", (f"k{i}", BODY))
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        c.close()


async def _async_sequential(path: Path, durability: str, n: int) -> float:
    ledger = await Ledger.open(str(path), durability=durability, targets=[Target("payments")])
    run = uuid.uuid4().hex
    try:
        for i in range(-WARM, n):
            if i == 0:
                t0 = time.perf_counter()
            await ledger.execute(
                target="payments", operation="refund.create", run_id=run, step=f"refund-{i}", request=REQUEST,
                call=_acall,
            )  # fmt: skip
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        await ledger.close()


def async_sequential_us(path: Path, durability: str, n: int) -> float:
    return asyncio.run(_async_sequential(path, durability, n))


def sync_sequential_us(path: Path, durability: str, n: int, inline_calls: bool = False) -> float:
    with SyncLedger.open(
        str(path), durability=durability, targets=[Target("payments")], inline_calls=inline_calls
    ) as ledger:
        run = uuid.uuid4().hex
        for i in range(-WARM, n):
            if i == 0:
                t0 = time.perf_counter()
            ledger.execute(
                target="payments", operation="refund.create", run_id=run, step=f"refund-{i}", request=REQUEST,
                call=_scall,
            )  # fmt: skip
        return (time.perf_counter() - t0) / n * 1e6


def thread_round_trip_us(gap_us: float, n: int) -> float:
    """A job handed to an idle thread and its answer back (``queue.SimpleQueue``, as the sync path's
    call threads do), the caller busy for ``gap_us`` between two, us per round trip."""
    inbox: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    answers: queue.SimpleQueue[int] = queue.SimpleQueue()

    def serve() -> None:
        while (job := inbox.get()) is not None:
            answers.put(job)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    total = 0.0
    try:
        for i in range(n):
            busy_until = time.perf_counter() + gap_us / 1e6
            while time.perf_counter() < busy_until:
                pass
            t0 = time.perf_counter()
            inbox.put(i)
            answers.get(timeout=10)
            total += time.perf_counter() - t0
    finally:
        inbox.put(None)
        thread.join(10)
    return total / n * 1e6


async def _concurrent(path: Path, durability: str, n: int) -> float:
    ledger = await Ledger.open(str(path), durability=durability, targets=[Target("payments")])
    run = uuid.uuid4().hex
    per_task = max(1, n // CONCURRENCY)

    async def worker(w: int, steps: range) -> None:
        for j in steps:
            await ledger.execute(
                target="payments", operation="refund.create", run_id=run, step=f"refund-{w}-{j}", request=REQUEST,
                call=_acall,
            )  # fmt: skip

    try:
        await asyncio.gather(*(worker(w, range(-2, 0)) for w in range(CONCURRENCY)))  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w, range(per_task)) for w in range(CONCURRENCY)))
        return (time.perf_counter() - t0) / (per_task * CONCURRENCY) * 1e6
    finally:
        await ledger.close()


def concurrent_us(path: Path, durability: str, n: int) -> float:
    """Wall time per effect of ``CONCURRENCY`` tasks sharing one ledger."""
    return asyncio.run(_concurrent(path, durability, n))


class _Order(TypedDict, total=False):
    order: str
    amount: int
    refund_id: str


def _graph(node: Callable[[_Order], _Order]) -> Any:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(_Order)
    g.add_node("refund", node)
    g.add_edge(START, "refund")
    g.add_edge("refund", END)
    return g.compile(checkpointer=InMemorySaver())


def _steps(graph: Any, n: int) -> float:
    run = uuid.uuid4().hex
    for i in range(-WARM, n):
        if i == 0:
            t0 = time.perf_counter()
        out = graph.invoke({"order": "123", "amount": 4800}, {"configurable": {"thread_id": f"{run}-{i}"}})
        if not out.get("refund_id"):
            raise AssertionError(f"the node returned no refund id: {out}")
    return (time.perf_counter() - t0) / n * 1e6


def langgraph_plain_us(n: int) -> float:
    """A LangGraph step whose node calls the destination directly (no ledger)."""

    def node(state: _Order) -> _Order:
        return {"refund_id": _scall(f"payments:{state['order']}")["id"]}

    return _steps(_graph(node), n)


def langgraph_adapter_us(path: Path, durability: str, n: int, inline_calls: bool = False) -> float:
    """The same step, the call made through ``ledger_effect`` (keyed by the thread and the node)."""
    from effect_ledger.langgraph import ledger_effect

    with SyncLedger.open(
        str(path), durability=durability, targets=[Target("payments")], inline_calls=inline_calls
    ) as ledger:

        @ledger_effect(ledger, target="payments", operation="refund.create")
        def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
            return _scall(idempotency_key)

        def node(state: _Order) -> _Order:
            return {"refund_id": refund(state["order"], state["amount"]).value["id"]}

        return _steps(_graph(node), n)


def _ratio_metric(name: str, runs: list[float], against: list[float], against_what: str, target: float) -> Metric:
    """A us/effect row checked on its per-repetition ratio to ``against`` (a ceiling)."""
    return Metric(
        name, "us/effect", list(runs), higher_is_better=False, raw_limit_runs=list(against), raw_what=against_what,
        ratio_target=target, ratio_runs=[r / a for r, a in zip(runs, against, strict=True)],
    )  # fmt: skip


def run(ctx: Context) -> BenchResult:
    wd = ctx.workdir("sdk_peers")
    n = {"NORMAL": ctx.size(2000, 300), "FULL": ctx.size(1000, 150)}
    n_conc = {"NORMAL": ctx.size(6400, 1280), "FULL": ctx.size(3200, 640)}
    n_graph = ctx.size(1000, 200)
    res = BenchResult("sdk_peers", "ran", info={"disk": disk_info(wd), "concurrency": CONCURRENCY})
    files = iter(range(1_000_000))
    m: dict[str, list[float]] = {}

    def f(tag: str) -> Path:
        return wd / f"{tag}-{next(files)}.db"

    def add(key: str, value: float) -> float:
        m.setdefault(key, []).append(value)
        return value

    try:
        import langgraph  # noqa: F401
    except ImportError:
        has_langgraph = False
    else:
        has_langgraph = True
    for rep in range(ctx.reps):
        for d in DURABILITIES:
            bare = add(f"bare {d}", bare_commit_us(f("bare"), d, n[d]))
            a = add(f"async {d}", async_sequential_us(f("async"), d, n[d]))
            s = add(f"sync {d}", sync_sequential_us(f("sync"), d, n[d]))
            si = add(f"sync inline {d}", sync_sequential_us(f("sync-inline"), d, n[d], inline_calls=True))
            c = add(f"concurrent {d}", concurrent_us(f("conc"), d, n_conc[d]))
            ctx.progress(
                f"sdk_peers {d} rep {rep + 1}/{ctx.reps}: bare commit {fmt(bare)} us; Ledger.execute {fmt(a)} us; "
                f"SyncLedger.execute {fmt(s)} us ({s / a:.2f}x), inline_calls {fmt(si)} us ({si / a:.2f}x); "
                f"{CONCURRENCY} concurrent {fmt(c)} us/effect ({c / bare:.2f}x bare)"
            )
        trip = add("thread round trip", thread_round_trip_us(m["async NORMAL"][-1], ctx.size(1000, 200)))
        ctx.progress(
            f"sdk_peers rep {rep + 1}/{ctx.reps}: a thread round trip after {fmt(m['async NORMAL'][-1])} us of work "
            f"{fmt(trip)} us; SyncLedger.execute NORMAL - Ledger.execute NORMAL "
            f"{fmt(m['sync NORMAL'][-1] - m['async NORMAL'][-1])} us"
        )
        if has_langgraph:
            plain = add("langgraph plain", langgraph_plain_us(n_graph))
            adapted = add("langgraph adapter", langgraph_adapter_us(f("lg"), "NORMAL", n_graph))
            inl = add("langgraph adapter inline", langgraph_adapter_us(f("lgi"), "NORMAL", n_graph, inline_calls=True))
            add("langgraph plain + Ledger.execute", plain + m["async NORMAL"][-1])
            ctx.progress(
                f"sdk_peers LangGraph rep {rep + 1}/{ctx.reps}: step {fmt(plain)} us, with the adapter "
                f"{fmt(adapted)} us ({adapted / (plain + m['async NORMAL'][-1]):.2f}x step + Ledger.execute), "
                f"over inline_calls {fmt(inl)} us ({inl / (plain + m['async NORMAL'][-1]):.2f}x)"
            )
    for d in DURABILITIES:
        row = _ratio_metric(f"SyncLedger.execute {d}", m[f"sync {d}"], m[f"async {d}"],
                            f"Ledger.execute {d}, us", 1.25)  # fmt: skip
        row.extra = {
            "effects": n[d],
            f"bare_{d.lower()}_commit_us": statistics.median(m[f"bare {d}"]),
            "thread_round_trip_us": statistics.median(m["thread round trip"]),
        }
        res.metrics.append(row)
        inline = _ratio_metric(f"SyncLedger.execute inline_calls {d}", m[f"sync inline {d}"], m[f"async {d}"],
                               f"Ledger.execute {d}, us", 1.25)  # fmt: skip
        inline.extra = {"effects": n[d]}
        res.metrics.append(inline)
    full = _ratio_metric("Ledger.execute FULL", m["async FULL"], [2 * b for b in m["bare FULL"]],
                         "two bare FULL commits (sqlite3), us", 1.5)  # fmt: skip
    full.extra = {"effects": n["FULL"]}
    conc_n = _ratio_metric(f"{CONCURRENCY} concurrent NORMAL", m["concurrent NORMAL"], m["bare NORMAL"],
                           "one bare NORMAL commit (sqlite3), us", 8.5)  # fmt: skip
    conc_n.extra = {"effects": n_conc["NORMAL"], "effects_per_s": 1e6 / statistics.median(m["concurrent NORMAL"])}
    conc_f = _ratio_metric(f"{CONCURRENCY} concurrent FULL", m["concurrent FULL"], m["concurrent NORMAL"],
                           f"{CONCURRENCY} concurrent NORMAL, us/effect", 1.0)  # fmt: skip
    conc_f.extra = {"effects": n_conc["FULL"], "effects_per_s": 1e6 / statistics.median(m["concurrent FULL"])}
    res.metrics += [full, conc_n, conc_f]
    if has_langgraph:
        lg = _ratio_metric("LangGraph node + adapter", m["langgraph adapter"], m["langgraph plain + Ledger.execute"],
                           "the node without it + one Ledger.execute NORMAL, us", 1.3)  # fmt: skip
        lg.extra = {"steps": n_graph, "langgraph_step_without_ledger_us": statistics.median(m["langgraph plain"])}
        lgi = _ratio_metric("LangGraph node + adapter, inline_calls", m["langgraph adapter inline"],
                            m["langgraph plain + Ledger.execute"],
                            "the node without it + one Ledger.execute NORMAL, us", 1.3)  # fmt: skip
        lgi.extra = {"steps": n_graph}
        res.metrics += [lg, lgi]
    else:
        res.note = "LangGraph row skipped: langgraph is not installed (the [langgraph] extra)"
    res.info["peers_us"] = {k: statistics.median(v) for k, v in m.items()}
    return res
