"""The faults ``make chaos`` runs, one at a time: each starts, holds, heals, and names what it did.

Groups (the report's availability is per group and per kind):

* broker down: kill -9 of the leader of a busy partition, of the active controller, of a follower;
* broker paused: SIGSTOP (a GC pause, a VM stall), then SIGCONT, of a partition leader that does not
  coordinate the workers' consumer group, and of the one that does;
* process paused: SIGSTOP of a worker; of an agent host for longer than its calls' deadlines (the
  zombie: when it wakes it must not perform a call that someone else now owns);
* partition: a broker cut from everyone; the cluster split 1|2 (a broker cut from its peers only);
  an agent host from the brokers; a worker from the brokers; an agent host from its destinations;
* clock: an agent host and a worker restarted with their wall clocks 2 h ahead or behind, then
  restarted on the real clock.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from effect_ledger.sdk.ledger import DEFAULT_CONFIRM_WITHIN_S
from tests.chaos import net
from tests.chaos.takeover import unfinished
from tests.chaos.world import World

#: Every kind, in the order the short run takes them.
KINDS = (
    "kill-leader", "kill-controller", "kill-follower", "pause-broker", "pause-coordinator", "pause-worker",
    "zombie-agent",
    "isolate-broker", "split-brokers", "agent-from-brokers", "worker-from-brokers", "agent-from-destinations",
    "skew-agent", "skew-worker",
)  # fmt: skip
GROUP = {
    "kill-leader": "broker down", "kill-controller": "broker down", "kill-follower": "broker down",
    "pause-broker": "broker paused", "pause-coordinator": "broker paused",
    "pause-worker": "process paused", "zombie-agent": "process paused",
    "isolate-broker": "partition", "split-brokers": "partition", "agent-from-brokers": "partition",
    "worker-from-brokers": "partition", "agent-from-destinations": "partition",
    "skew-agent": "clock", "skew-worker": "clock",
}  # fmt: skip


@dataclass
class Fault:
    kind: str
    what: str
    heal: Callable[[], str]
    #: Something the fault does while it holds: (seconds after its start, action, what it did).
    later: tuple[float, Callable[[], object], str] | None = None
    #: The least the fault must hold for its point to be made.
    min_hold_s: float = 0.0


def leader_of(world: World, topic: str, partition: int = 0) -> int:
    admin = AdminClient(world.cfg.confluent())
    md = admin.list_topics(topic, timeout=10)
    t = md.topics.get(topic)
    if t is None or t.error is not None or partition not in t.partitions:
        raise RuntimeError(f"no metadata for {topic}[{partition}]")
    leader = t.partitions[partition].leader
    if leader not in net.BROKERS:
        raise RuntimeError(f"{topic}[{partition}] has no leader now ({leader})")
    return int(leader)


def under_replicated(world: World) -> int:
    """Partitions of the run's topics and of the group's offsets whose in-sync replicas are fewer
    than their replicas (a broker back from a fault that has not caught up yet); -1 when the
    cluster could not be asked."""
    admin = AdminClient(world.cfg.confluent())
    try:
        md = admin.list_topics(timeout=5)
    except Exception:  # noqa: BLE001 - no answer in time: not known to be replicated
        return -1
    return sum(
        1
        for name, t in md.topics.items()
        if name.startswith(world.cfg.prefix) or name == "__consumer_offsets"
        for part in t.partitions.values()
        if len(part.isrs) < len(part.replicas)
    )


def coordinator(world: World) -> int:
    """The broker that coordinates the workers' consumer group."""
    from effect_ledger.processors.processor import ProcessorSettings

    admin = AdminClient(world.cfg.confluent())
    group = f"{world.cfg.prefix}{ProcessorSettings().app_id}"
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    return int(desc.coordinator.id)


def controller() -> int:
    return int(net.cluster("controller").strip())


class Nemesis:
    def __init__(self, world: World, rng: random.Random) -> None:
        self.world, self.rng = world, rng
        self.skew_sign = 1

    def busy_leader(self) -> int:
        return leader_of(self.world, self.world.cfg.topics.events, self.rng.randrange(self.world.cfg.partitions))

    def start(self, kind: str) -> Fault:
        w = self.world
        if kind in ("kill-leader", "kill-controller", "kill-follower"):
            if kind == "kill-leader":
                n = self.busy_leader()
            elif kind == "kill-controller":
                n = controller()
            else:
                busy = {self.busy_leader(), controller()}
                n = self.rng.choice([b for b in net.BROKERS if b not in busy] or list(net.BROKERS))
            net.cluster("kill", str(n))
            return Fault(kind, f"kill -9 broker {n}", lambda: (net.cluster("start", str(n)), f"broker {n} started")[1])
        if kind in ("pause-broker", "pause-coordinator"):
            coord = coordinator(w)
            if kind == "pause-coordinator":
                n = coord
            else:  # a partition's leader that does not coordinate the workers' group
                leaders = {leader_of(w, w.cfg.topics.events, p) for p in range(w.cfg.partitions)} - {coord}
                n = self.rng.choice(sorted(leaders)) if leaders else self.busy_leader()
            net.cluster("pause", str(n))
            return Fault(kind, f"SIGSTOP broker {n}", lambda: (net.cluster("resume", str(n)), f"broker {n} resumed")[1])
        if kind == "pause-worker":
            child = w.workers["w2"]
            child.pause()
            return Fault(kind, f"SIGSTOP {child.name}", lambda: (child.resume(), f"{child.name} resumed")[1])
        if kind == "zombie-agent":
            # Frozen past its calls' deadlines (and the time a call may still land after one), so the
            # ledger times its attempts out and the reconcilers answer for them; then a successor
            # takes its unfinished calls over while it is still frozen, and it wakes up.
            child = w.agents["b"]
            pending = w.wd / "history-b.jsonl"
            end = time.monotonic() + 10  # frozen with calls in flight: as soon as one is started
            while not unfinished(str(pending)) and time.monotonic() < end:
                time.sleep(0.005)
            child.pause()
            # the deadline (the confirmations' allowance and the timeout), the default lands_within,
            # the timer's grace
            after = DEFAULT_CONFIRM_WITHIN_S + w.timeout + 2.0 + 1.5
            return Fault(kind, f"SIGSTOP {child.name}, its unfinished calls taken over", lambda: (child.resume(),
                         f"{child.name} resumed")[1], later=(after, lambda: w.start_takeover("b"),
                         "a successor takes over b's unfinished calls"), min_hold_s=after + 10)  # fmt: skip
        if kind in ("isolate-broker", "split-brokers"):
            n = self.busy_leader()
            side = net.BROKERS[n]
            others = [b for b in net.BROKERS.values() if b != side]
            if kind == "isolate-broker":
                others += [*net.SIDES, "host"]
            for o in others:
                net.cut(side, o)
            what = f"broker {n} cut from " + ("everyone" if kind == "isolate-broker" else "the other two brokers")
            return Fault(kind, what, lambda: (net.heal(), "healed")[1])
        if kind in ("agent-from-brokers", "worker-from-brokers", "agent-from-destinations"):
            side = {"agent-from-brokers": "a", "worker-from-brokers": "w1", "agent-from-destinations": "a"}[kind]
            peers = ["host"] if kind == "agent-from-destinations" else list(net.BROKERS.values())
            for p in peers:
                net.cut(side, p)
            return Fault(kind, f"{side} cut from {', '.join(peers)}", lambda: (net.heal(), "healed")[1])
        if kind in ("skew-agent", "skew-worker"):
            child = w.agents["a"] if kind == "skew-agent" else w.workers["w1"]
            skew = "+2h" if self.skew_sign > 0 else "-2h"
            self.skew_sign = -self.skew_sign
            w.restart(child, skew)

            def heal() -> str:
                w.restart(child, None)
                return f"{child.name} on the real clock again"

            return Fault(kind, f"{child.name} restarted with its clock {skew}", heal)
        raise ValueError(f"unknown fault kind {kind!r}")
