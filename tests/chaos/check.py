"""The checker of ``make chaos``: the agents' histories, every destination's own record and the
ledger's final states (``effects.state``), read after the heal and the drain.

Anomalies (any one fails the run):

* **doubled**: a key executed more than once at a destination;
* **lost**: a key a caller was acknowledged on (a receipt, or an outcome it cannot know: the intent
  was written) that is neither settled nor escalated; or any key the ledger still holds open;
* **acknowledged missing**: a key a caller holds a receipt for that the ledger has no state of;
* **wrong verdict**: the ledger's final state disagrees with the destination (CONFIRMED with a
  receipt the destination never issued, or without any refund; FAILED or ABSENT while the
  destination made one; the destination's refund missing from a CONFIRMED effect), or a caller was
  handed a receipt for another request than its own (racing hosts with different amounts);
* **claims won twice**: two calls of one key both report they made the call.

Availability: per fault, the share of the calls started while it held that ended with a receipt,
and after its heal, how long until every host had a call started after the heal end with one.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from effect_ledger.core.model import OPEN_STATES, EffectState, State

#: Where a run must leave every effect: settled, or with a person (every state but the open ones).
SETTLED_OR_ESCALATED = frozenset(State) - OPEN_STATES


@dataclass
class Op:
    host: str
    key: str
    target: str
    amount: int
    t: float
    end: float | None = None
    kind: str = "pending"  # ok | fail | info | pending (no answer before the host stopped)
    receipt: str | None = None
    receipt_amount: int | None = None
    called: bool = False
    error: str | None = None


@dataclass
class Window:
    kind: str
    group: str
    what: str
    start: float
    heal: float
    healed: str = ""
    #: Seconds the run waited, before this fault, for the cluster to be fully replicated again
    #: after the one before (a broker restarted or cut off catching up): otherwise a broker faulted
    #: now would be the second one out of the in-sync replicas, and the figures those of two faults.
    replicated_wait_s: float = 0.0
    #: Seconds the run waited after the heal, beyond the gap, for every steady host to complete a
    #: call again: a recovery slower than the gap would otherwise run into the next fault, and be
    #: counted as that fault's unavailability and as this one's recovery at once.
    recovered_wait_s: float = 0.0


@dataclass
class Checked:
    ops: list[Op]
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.anomalies.values())


def read_history(path: Path) -> tuple[list[Op], int]:
    """The operations of one host's history, and how many calls it skipped (past its in-flight cap)."""
    ops: list[Op] = []
    open_ops: dict[tuple[str, str], list[Op]] = defaultdict(list)
    skipped = 0
    if not path.exists():
        return ops, 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        if r["op"] == "skip":
            skipped += int(r.get("count", 0))
            continue
        k = (r["host"], r["key"])
        if r["op"] == "invoke":
            op = Op(r["host"], r["key"], r["target"], int(r["amount"]), float(r["t"]))
            ops.append(op)
            open_ops[k].append(op)
            continue
        if not open_ops[k]:
            continue
        op = open_ops[k].pop(0)
        op.kind, op.end, op.error = r["op"], float(r["t"]), r.get("error")
        if r["op"] == "ok":
            op.receipt, op.called = r.get("receipt"), bool(r.get("called"))
            op.receipt_amount = r.get("amount")
    return ops, skipped


def check(ops: list[Op], skipped: int, refunds: dict[str, list[dict[str, Any]]], states: dict[str, EffectState],
          windows: list[Window], hosts: set[str]) -> Checked:  # fmt: skip
    """``hosts``: the agent hosts that run all along (availability and recovery are theirs; a zombie's
    successor only runs while it holds)."""
    out = Checked(ops)
    an: dict[str, list[str]] = {k: [] for k in ("doubled", "lost", "acknowledged_missing", "wrong_verdict",
                                                 "claims_won_twice")}  # fmt: skip
    out.anomalies = an
    made: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for target, rs in refunds.items():
        for r in rs:
            made[(target, r.get("idempotency_key") or f"(no key) {r['id']}")].append(r)
    for (target, key), rs in made.items():
        if len(rs) > 1:
            an["doubled"].append(f"{target} {key}: {len(rs)} refunds {[r['id'] for r in rs]}")
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    for key, kops in by_key.items():
        st = states.get(key)
        target = kops[0].target
        dest = made.get((target, key), [])
        oks = [o for o in kops if o.kind == "ok"]
        for o in oks:
            if o.receipt_amount is not None and o.receipt_amount != o.amount:
                an["wrong_verdict"].append(f"{key}: host {o.host} asked {o.amount}, was handed the receipt of "
                                           f"{o.receipt_amount} ({o.receipt})")  # fmt: skip
        if sum(1 for o in oks if o.called) > 1:
            an["claims_won_twice"].append(f"{key}: {[(o.host, o.receipt) for o in oks if o.called]}")
        if st is None:
            if oks:
                an["acknowledged_missing"].append(f"{key}: {len(oks)} receipt(s) handed out, no state")
            elif dest:
                an["wrong_verdict"].append(f"{key}: the destination made {len(dest)} refund(s), the ledger has none")
            continue
        if st.state in OPEN_STATES:  # acknowledged or not, an open effect after the drain is lost
            an["lost"].append(f"{key}: {st.state.value} after the drain ({[o.kind for o in kops]})")
        if oks and st.state is not State.CONFIRMED:
            an["lost"].append(f"{key}: a caller holds receipt {oks[0].receipt}, the ledger says {st.state.value}")
        if st.state is State.CONFIRMED:
            ids = {r["id"] for r in dest}
            if not dest:
                an["wrong_verdict"].append(f"{key}: CONFIRMED ({st.receipt_id}), the destination made no refund")
            elif st.receipt_id not in ids:
                an["wrong_verdict"].append(f"{key}: CONFIRMED with {st.receipt_id}, the destination made {sorted(ids)}")
        elif st.state in (State.FAILED, State.ABSENT) and dest:
            an["wrong_verdict"].append(f"{key}: {st.state.value}, but the destination made {[r['id'] for r in dest]}")
    kinds = Counter(o.kind for o in ops)
    final = Counter(s.state.value for k, s in states.items() if k in by_key)
    out.counts = {
        "calls": len(ops), "skipped": skipped, "ok": kinds["ok"], "fail": kinds["fail"], "info": kinds["info"],
        "pending": kinds["pending"], "keys": len(by_key), "race_keys": sum(1 for k in by_key if k.startswith("race.")),
        "final_states": dict(final), "refunds": sum(len(v) for v in refunds.values()),
        "errors": dict(Counter(o.error for o in ops if o.error).most_common(12)),
        "anomalies": {k: len(v) for k, v in an.items()},
    }  # fmt: skip
    steady = [o for o in ops if o.host in hosts]
    out.faults = [availability(w, steady) for w in windows]
    return out


class HistoryTail:
    """The steady hosts' histories followed as they grow (only what was appended since the last
    ``poll``), to tell while the run goes on whether each host has completed a call started since a
    given time: the run waits for that after each heal (``recovered_since``)."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths
        self.offsets = dict.fromkeys(paths, 0)
        self.partial = dict.fromkeys(paths, b"")
        self.started: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.last_completed_start: dict[str, float] = {}

    def poll(self) -> None:
        for host, path in self.paths.items():
            try:
                with path.open("rb") as f:
                    f.seek(self.offsets[host])
                    data = f.read()
            except FileNotFoundError:
                continue
            self.offsets[host] += len(data)
            *lines, self.partial[host] = (self.partial[host] + data).split(b"\n")
            for line in lines:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                if r.get("op") in (None, "skip"):
                    continue
                k = (r["host"], r["key"])
                if r["op"] == "invoke":
                    self.started[k].append(float(r["t"]))
                elif self.started[k]:
                    t = self.started[k].pop(0)
                    if answered(r["op"], r["key"], r.get("error")):
                        self.last_completed_start[host] = max(t, self.last_completed_start.get(host, t))

    def recovered_since(self, t: float) -> bool:
        """Every host has completed a call it started at ``t`` or later (what ``availability``
        measures the recovery by)."""
        return all(self.last_completed_start.get(h, -1.0) >= t for h in self.paths)


def answered(kind: str, key: str, error: str | None) -> bool:
    """A call the system answered for good: a receipt, or on a racing key the conflict the loser of
    the race must get."""
    return kind == "ok" or (key.startswith("race.") and error == "EffectConflict")


def completed(o: Op) -> bool:
    """``answered``, for an operation of a history."""
    return answered(o.kind, o.key, o.error)


def availability(w: Window, ops: list[Op]) -> dict[str, Any]:
    """The share of calls started while ``w`` held that ended with a receipt, and the time from the
    heal until every host that started calls afterwards had one end with a receipt."""
    during = [o for o in ops if w.start <= o.t < w.heal]
    ok = sum(1 for o in during if completed(o))
    after: dict[str, float] = {}
    for o in sorted((o for o in ops if o.t >= w.heal and completed(o) and o.end is not None), key=lambda o: o.end or 0):
        after.setdefault(o.host, (o.end or 0) - w.heal)
    hosts = {o.host for o in ops if o.t >= w.heal}
    recovered = max(after.values()) if after and set(after) >= hosts else None
    return {
        "kind": w.kind, "group": w.group, "what": w.what, "healed": w.healed, "start_s": w.start, "heal_s": w.heal,
        "held_s": round(w.heal - w.start, 1), "calls": len(during), "completed": ok,
        "availability": round(ok / len(during), 4) if during else None,
        "recovery_s": None if recovered is None else round(recovered, 2),
        "replicated_wait_s": round(w.replicated_wait_s, 1), "recovered_wait_s": round(w.recovered_wait_s, 1),
    }  # fmt: skip


def per_kind(faults: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in faults:
        groups[f["kind"]].append(f)
    for kind, fs in groups.items():
        calls = sum(f["calls"] for f in fs)
        done = sum(f["completed"] for f in fs)
        rec = [f["recovery_s"] for f in fs if f["recovery_s"] is not None]
        out[kind] = {
            "group": fs[0]["group"], "faults": len(fs), "calls": calls, "completed": done,
            "availability": round(done / calls, 4) if calls else None,
            "recovery_median_s": round(median(rec), 2) if rec else None, "recovery_max_s": max(rec) if rec else None,
            "not_recovered": sum(1 for f in fs if f["recovery_s"] is None),
        }  # fmt: skip
    return out


def markdown(c: Checked, meta: dict[str, Any], plot: str | None) -> str:
    kinds = per_kind(c.faults)
    n = c.counts
    lines = [
        f"# effect-ledger chaos run: {'PASS' if c.ok else 'FAIL'}", "",
        f"Seed {meta['seed']}, {meta['minutes']:g} min, {meta['rate']:g} effects/s per host, 2 agent hosts, 2 workers, "
        f"1 reconciler, 3 brokers (replication 3, min.insync.replicas 2) in their own network namespaces; "
        f"started {meta['started']}. Replay: `{meta['replay']}`.", "",
        "| effects | faults | lost | doubled | wrong verdicts | acknowledged missing | claims won twice |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {n['keys']:,} | {len(c.faults)} | {n['anomalies']['lost']} | {n['anomalies']['doubled']} | "
        f"{n['anomalies']['wrong_verdict']} | {n['anomalies']['acknowledged_missing']} | "
        f"{n['anomalies']['claims_won_twice']} |", "",
        f"Calls: {n['calls']:,} started ({n['race_keys']:,} racing keys), {n['ok']:,} with a receipt, {n['fail']:,} "
        f"refused before any call, {n['info']:,} with an unknown outcome, {n['pending']} unanswered at the stop, "
        f"{n['skipped']:,} skipped (a host past its in-flight cap). Refunds made: {n['refunds']:,}. Final states: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(n["final_states"].items())) + ".", "",
        "## Availability per fault kind", "",
        "| fault | group | times | calls during | completed | recovery after heal (median / max) | not recovered |",
        "|---|---|---:|---:|---:|---|---:|",
    ]  # fmt: skip
    for kind, k in kinds.items():
        av = "n/a" if k["availability"] is None else f"{k['availability']:.1%}"
        rec = "n/a" if k["recovery_median_s"] is None else f"{k['recovery_median_s']} s / {k['recovery_max_s']} s"
        lines.append(
            f"| {kind} | {k['group']} | {k['faults']} | {k['calls']:,} | {av} | {rec} | {k['not_recovered']} |"
        )
    lines += [
        "",
        "## Faults",
        "",
        "| start (s) | held (s) | fault | calls | completed | recovery | waited before it for the replicas "
        "| waited after it for the recovery, beyond the gap |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for f in c.faults:
        av = "n/a" if f["availability"] is None else f"{f['availability']:.1%}"
        rec = "n/a" if f["recovery_s"] is None else f"{f['recovery_s']} s"
        lines.append(
            f"| {f['start_s'] - meta['t0']:.0f} | {f['held_s']} | {f['what']} | {f['calls']} | {av} | {rec} "
            f"| {f['replicated_wait_s']} s | {f.get('recovered_wait_s', 0.0)} s |"
        )
    if n["errors"]:
        lines += ["", "Errors callers met: " + ", ".join(f"{k} {v:,}" for k, v in n["errors"].items()) + "."]
    for name, items in c.anomalies.items():
        if items:
            lines += ["", f"## {name} ({len(items)})", "", *[f"- {x}" for x in items[:50]]]
    if plot:
        lines += ["", f"![timeline]({plot})"]
    return "\n".join(lines) + "\n"


def plot(path: Path, c: Checked, t0: float, title: str) -> Path | None:
    """Calls started per second and the share that ended with a receipt, faults shaded."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not c.ops:
        return None
    end = int(max(o.t for o in c.ops) - t0) + 1
    started = [0] * (end + 1)
    done = [0] * (end + 1)
    for o in c.ops:
        s = int(o.t - t0)
        started[s] += 1
        done[s] += o.kind == "ok"
    share = [d / s if s else None for d, s in zip(done, started, strict=True)]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    xs = list(range(end + 1))
    ax1.plot(xs, started, label="calls started /s")
    ax1.plot(xs, done, label="of them with a receipt")
    ax2.plot(xs, [s if s is not None else float("nan") for s in share], ".", markersize=3)
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_ylabel("share with a receipt")
    ax1.set_ylabel("calls")
    ax2.set_xlabel("seconds since the load started")
    colors = {"broker down": "tab:red", "broker paused": "tab:orange", "process paused": "tab:purple",
              "partition": "tab:blue", "clock": "tab:green"}  # fmt: skip
    seen: set[str] = set()
    for f in c.faults:
        for ax in (ax1, ax2):
            ax.axvspan(f["start_s"] - t0, f["heal_s"] - t0, alpha=0.15, color=colors.get(f["group"], "grey"),
                       label=None if f["group"] in seen or ax is ax2 else f["group"])  # fmt: skip
        seen.add(f["group"])
        ax1.text(f["start_s"] - t0, max(started) * 1.02 if started else 1, f["kind"], rotation=90, fontsize=6,
                 va="bottom")  # fmt: skip
    ax1.legend(fontsize=7, loc="lower left")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
