"""``python -m tests.chaos`` (``make chaos``): effect-ledger on a replicated cluster under faults.

Three KRaft brokers (replication 3, ``min.insync.replicas`` 2, unclean election off), each in its own
network namespace; two agent hosts (``tests.chaos.agent``), two workers and a reconciler, each in its
own; three destinations (honours keys and answers lookups; lookups only; neither) on the bridge. The
agents run refunds at ``--rate`` each while the nemesis (``tests.chaos.nemesis``) runs one fault at a
time: kills, pauses, network partitions and clock skews. Then every fault is healed, the agents stop,
the system drains, and the checker (``tests.chaos.check``) reads the histories, the destinations'
records and ``effects.state``. The report goes to ``--out``: ``chaos-report.md``, ``chaos-report.json``
and ``chaos.png`` (calls per second, faults shaded); after an anomaly also ``hosts/``, the agent
hosts' ledger files (``effects trace KEY --db OUT/hosts/host-a.db``). Exit status 0: no anomaly;
1: an anomaly; 2: the run could not be made (not root, no Java, a cluster that did not come up).

``--short`` runs one fault of each kind (about 6 minutes, the variant ``make test`` runs); without it
the faults cycle, each kind in a random order per round, for ``--minutes``, and with ``--per-kind N``
until every kind has also held N times (``make chaos``: 30 minutes and 10 of each kind, about 45
minutes; never past three times ``--minutes``). Needs root (``ip netns``,
nftables) and libfaketime; ``make chaos`` installs what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from effect_ledger.streams.admin import wait_ready
from tests.chaos import check, net
from tests.chaos.nemesis import GROUP, KINDS, Nemesis, under_replicated
from tests.chaos.world import World
from tests.topic_io import TopicReader

_SHAPING = ("per_kind", "rate", "hold", "gap", "timeout", "partitions")  # options a replay must repeat


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="minutes of faults (without --short) [30]")
    p.add_argument("--per-kind", type=int, default=0, metavar="N",
                   help="and until every kind has held N times (make chaos: 10; at most 3x --minutes) [0]")  # fmt: skip
    p.add_argument("--short", action="store_true", help="one fault of each kind, in a fixed order")
    p.add_argument("--rate", type=float, default=10.0, help="effects per second per agent host [10]")
    p.add_argument("--seed", type=int, default=None, help="the nemesis's seed [random, printed]")
    p.add_argument("--hold", type=float, default=None, help="seconds each fault holds [short: 12; else 5-15]")
    p.add_argument("--gap", type=float, default=None, help="seconds between faults [short: 10; else 5-12]")
    p.add_argument("--faults", default=",".join(KINDS), help=f"kinds to run, comma-separated [{','.join(KINDS)}]")
    p.add_argument("--timeout", type=float, default=2.0, help="each call's timeout = its deadline, s [2]")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the run's topics [6]")
    p.add_argument("--drain", type=float, default=180.0, help="most seconds the drain waits for open effects [180]")
    p.add_argument("--out", default="chaos-report", help="folder of the report [chaos-report]")
    p.add_argument("--keep", action="store_true", help="leave the cluster and namespaces up afterwards")
    a = p.parse_args(argv)
    a.shaping = {name: p.get_default(name) for name in _SHAPING}  # the defaults, for the replay
    a.kinds = [k.strip() for k in a.faults.split(",") if k.strip()]
    unknown = [k for k in a.kinds if k not in KINDS]
    if unknown:
        p.error(f"unknown fault kind(s): {', '.join(unknown)}; known: {', '.join(KINDS)}")
    return a


def replay_command(a: argparse.Namespace, seed: int) -> str:
    """The command that runs this schedule again: the seed and every option that shapes the run
    (the fault kinds, the rate, the holds and gaps, the timeouts) where it is not the default."""
    parts = ["python -m tests.chaos", "--short" if a.short else f"--minutes {a.minutes:g}", f"--seed {seed}"]
    if a.kinds != list(KINDS):
        parts.append(f"--faults {','.join(a.kinds)}")
    for name, default in a.shaping.items():
        value = getattr(a, name)
        if value != default:
            parts.append(f"--{name.replace('_', '-')} {value:g}")
    return " ".join(parts)


def progress(msg: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] chaos: {msg}", flush=True)


def schedule(a: argparse.Namespace, rng: random.Random) -> list[str]:
    if a.short:
        return list(a.kinds)
    per_round = (a.hold or 10) + (a.gap or 8.5)
    rounds = max(1, int(a.minutes * 60 / (per_round * len(a.kinds))) + 1, a.per_kind + 1)
    out: list[str] = []
    for _ in range(rounds):
        r = list(a.kinds)
        rng.shuffle(r)
        out += r
    return out


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    # SIGTERM (a test's cap, a CI job cancelled) ends the run through the same cleanup as Ctrl-C:
    # children stopped, cluster down, namespaces gone.
    signal.signal(signal.SIGTERM, _interrupt)
    if os.geteuid() != 0:
        print("chaos: needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    for tool in ("ip", "nft", "java", "cc"):
        if shutil.which(tool) is None:
            print(f"chaos: no {tool!r} on PATH (make chaos installs nftables, faketime and Java)", file=sys.stderr)
            return 2
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    replay = replay_command(a, seed)
    progress(f"seed {seed} (replay: {replay})")
    wd = Path(tempfile.mkdtemp(prefix="chaos-"))
    world: World | None = None
    code = 2
    try:
        progress("network namespaces and a 3-broker cluster")
        net.up()
        world = World(wd, f"chaos{uuid.uuid4().hex[:8]}.", a.partitions, a.rate, a.timeout)
        wait_ready(world.cfg, timeout=60)
        world.start_destinations(lost=0.002, slow=0.002)
        world.start_services()
        world.wait_ready()
        progress("workers ready; agent hosts start")
        world.start_agents()
        code = run(a, world, rng, seed, out, replay)
        return code
    except KeyboardInterrupt:
        print("chaos: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        traceback.print_exc()
        print(f"chaos: the run could not be made: {e} (logs in {wd})", file=sys.stderr)
        return 2
    finally:
        if world is not None:
            world.stop()
            for log in wd.glob("*.log"):
                (out / "logs").mkdir(exist_ok=True)
                shutil.copy(log, out / "logs" / log.name)
            for h in wd.glob("history-*.jsonl"):
                shutil.copy(h, out / h.name)
            if code == 1:
                # An anomaly: the agent hosts' own ledger files say what each host wrote and sent
                # (``effects trace KEY --db OUT/hosts/host-a.db``); a passing run does not keep them.
                (out / "hosts").mkdir(exist_ok=True)
                for db in wd.glob("*.db*"):
                    shutil.copy(db, out / "hosts" / db.name)
        if not a.keep:
            try:
                net.down()
            except Exception as e:
                print(f"chaos: tearing the cluster down: {e}", file=sys.stderr)
        shutil.rmtree(wd, ignore_errors=True)


def heal_everything(world: World) -> None:
    net.heal()
    for n in net.BROKERS:
        pid = net.broker_pid(n)
        if pid is None or not _alive(pid):
            net.cluster("start", str(n))
        else:
            net.cluster("resume", str(n))
    for c in world.children():
        if c.paused:
            c.resume()
        if c.skew is not None:
            world.restart(c, None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _wait_calls(world: World, seconds: float) -> None:
    """Wait ``seconds``, restarting any child that exited on its own (counted: it should not)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for c in world.children():
            if not c.alive and not c.paused:
                world.unexpected.append(
                    f"{time.monotonic():.0f}: {c.name} exited ({c.proc.returncode if c.proc else '?'})"
                )
                progress(f"{c.name} exited on its own: restarted")
                c.start(c.skew)
        time.sleep(0.5)


#: The most a fault waits for the one before to be healed in the cluster too (every partition's
#: replicas back in sync); past it, the fault starts all the same and the wait says so.
REPLICATED_WAIT_S = 60.0


def _wait_replicated(world: World, bound_s: float) -> float:
    """Wait until no partition of the run is under-replicated (at most ``bound_s``); the seconds waited."""
    t = time.monotonic()
    while (left := under_replicated(world)) != 0:
        if time.monotonic() - t >= bound_s:
            progress(f"{left} partitions still under-replicated after {bound_s:.0f} s: the next fault starts anyway")
            break
        _wait_calls(world, 1)
    waited = time.monotonic() - t
    if waited >= 1:
        progress(f"waited {waited:.0f} s for every partition's replicas to be back in sync")
    return waited


#: The most the run waits after a heal for every steady host to complete a call again before the
#: next fault starts (the gap is waited anyway); past it, the next fault starts all the same.
RECOVERED_WAIT_S = 60.0


def _wait_recovered(world: World, tail: check.HistoryTail, healed_at: float, gap: float, bound_s: float) -> float:
    """Wait until every steady host has completed a call started since ``healed_at``, at most
    ``bound_s``; then the rest of ``gap``. The seconds waited beyond the gap (0 when the recovery
    came within it, as it should). Draws nothing from the schedule's random numbers: a replay is the
    same schedule."""
    while True:
        tail.poll()
        waited = time.monotonic() - healed_at
        if tail.recovered_since(healed_at):
            break
        if waited >= bound_s:
            progress(f"some agent host completed no call in the {bound_s:.0f} s after the heal: the next fault starts")
            break
        _wait_calls(world, 0.5)
    if waited < gap:
        _wait_calls(world, gap - waited)
        return 0.0
    progress(f"calls completed again on every agent host {waited:.0f} s after the heal (the gap was {gap:.0f} s)")
    return waited - gap


def run(a: argparse.Namespace, world: World, rng: random.Random, seed: int, out: Path, replay: str) -> int:
    t0 = time.monotonic()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    nemesis = Nemesis(world, rng)
    _wait_calls(world, 15)  # the load settles before the first fault
    windows: list[check.Window] = []
    tail = check.HistoryTail({h: world.wd / f"history-{h}.jsonl" for h in world.agents})
    kinds = schedule(a, rng)
    end_by = t0 + (a.minutes * 60 if not a.short else 1e9)
    cap = t0 + a.minutes * 60 * 3  # --per-kind: bounded all the same
    held: dict[str, int] = dict.fromkeys(a.kinds, 0)
    for i, kind in enumerate(kinds):
        now = time.monotonic()
        if now >= end_by and (min(held.values()) >= a.per_kind or now >= cap):
            if min(held.values()) < a.per_kind:
                progress(f"stopped at 3x --minutes with a kind held {min(held.values())} times, not {a.per_kind}")
            break
        hold = a.hold if a.hold is not None else (12.0 if a.short else rng.uniform(5, 15))
        gap = a.gap if a.gap is not None else (10.0 if a.short else rng.uniform(5, 12))
        waited = _wait_replicated(world, REPLICATED_WAIT_S)
        start = time.monotonic()
        try:
            fault = nemesis.start(kind)
        except Exception as e:  # a leader election in progress: no leader to pick right now
            progress(f"fault {kind} not started: {e}")
            _wait_calls(world, 2)
            continue
        hold = max(hold, fault.min_hold_s)
        progress(f"fault {i + 1}/{len(kinds)} {kind}: {fault.what} for {hold:.0f} s")
        if fault.later is not None:
            delay, act, what = fault.later
            _wait_calls(world, delay)
            act()
            progress(what)
            _wait_calls(world, hold - delay)
        else:
            _wait_calls(world, hold)
        heal_at = time.monotonic()
        healed = fault.heal()
        window = check.Window(kind, GROUP[kind], fault.what, start, heal_at, healed, waited)
        windows.append(window)
        held[kind] += 1
        window.recovered_wait_s = _wait_recovered(world, tail, heal_at, gap, RECOVERED_WAIT_S)
    progress("every fault healed; the load runs 15 s more")
    heal_everything(world)
    _wait_calls(world, 15)
    load_end = time.monotonic()
    world.stop_agents()
    world.wait_takeovers()
    progress("agents stopped; draining")
    ops: list[check.Op] = []
    skipped = 0
    for path in sorted(world.wd.glob("history-*.jsonl")):  # the agent hosts' and their successors'
        o, s = check.read_history(path)
        ops += o
        skipped += s
    keys = {o.key for o in ops}
    states = drain(world, keys, a.drain)
    refunds = world.refunds()
    c = check.check(ops, skipped, refunds, states, windows, set(world.agents))
    meta: dict[str, Any] = {
        "seed": seed, "short": a.short, "minutes": round((load_end - t0) / 60, 1), "rate": a.rate, "started": started,
        "replay": replay, "t0": t0, "partitions": a.partitions, "call_timeout_s": a.timeout,
        "unexpected_exits": world.unexpected, "kinds": a.kinds,
    }  # fmt: skip
    png = check.plot(out / "chaos.png", c, t0, f"effect-ledger chaos run, seed {seed}")
    (out / "chaos-report.md").write_text(check.markdown(c, meta, png.name if png else None))
    (out / "chaos-report.json").write_text(json.dumps({"meta": meta, "counts": c.counts, "faults": c.faults,
                                                       "per_kind": check.per_kind(c.faults),
                                                       "anomalies": c.anomalies}, indent=2))  # fmt: skip
    n = c.counts["anomalies"]
    print(f"chaos {'PASS' if c.ok else 'FAIL'}: {c.counts['keys']:,} effects, {len(windows)} faults, "
          f"lost {n['lost']}, doubled {n['doubled']}, wrong verdicts {n['wrong_verdict']}, acknowledged missing "
          f"{n['acknowledged_missing']}, claims won twice {n['claims_won_twice']}; "
          f"report {out}/chaos-report.md")  # fmt: skip
    return 0 if c.ok else 1


def drain(world: World, keys: set[str], cap_s: float) -> dict[str, Any]:
    """Read effects.state until every key of the run is settled or escalated, or ``cap_s`` passed
    with no key settling; the final states."""
    settled = check.SETTLED_OR_ESCALATED
    with TopicReader(world.cfg, world.cfg.topics.state) as reader:
        best, since = None, time.monotonic()
        while True:
            reader.poll(0.5)
            latest = reader.latest()
            still = sum(1 for k in keys if k in latest and latest[k].state not in settled)
            if still == 0 and time.monotonic() - since > 5:
                break
            if best is None or still < best:
                best, since = still, time.monotonic()
                progress(f"{still} effects still open")
            elif time.monotonic() - since > cap_s:
                progress(f"{still} effects still open after {cap_s:.0f} s without progress")
                break
        reader.drain(60)
        return reader.latest()


if __name__ == "__main__":
    sys.exit(main())
