"""No writer's clock decides: real processes whose wall clock is two hours off (libfaketime), over a
real broker, against a gateway that does not dedupe keys but answers lookups truthfully.

Each road the protocol simulator found (``make sim``) with a process of each kind skewed, both ways:

* an operator ahead records ABSENT while the call may still land (``effects resolve --absent``);
  one behind is not kept waiting for hours;
* an agent behind writes an intent whose deadline is already past for everyone else, and a
  reconciler's "absent so far" became ABSENT while its call was still landing; one ahead made its
  attempt time out two hours late;
* a reconciler ahead skipped the wait for a call that may still land;
* a worker ahead timed a call out while it was running; one behind two hours late.

Every event that carries a time is written by a skewed process somewhere here: intents, outcomes
and receipts (agents), resolutions (reconcilers), decisions (operators), timeouts (workers).

The skew is libfaketime (Debian's ``faketime``, ``scripts/install-faketime.sh``) preloaded into the
child, behind a small shim that keeps librdkafka's condition waits on real time
(``faketime/realtime_waits.c``); the broker's JVM is never skewed: its clock is the log's.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import State
from effect_ledger.demo.agent import write_declaration
from effect_ledger.demo.gateway import Gateway
from effect_ledger.streams.config import KafkaConfig
from tests.services import Processor, Reconcilers, wait_for
from tests.topic_io import TopicReader, run_agent

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WAIT = 90
TIMEOUT_S = 1.5  # the agents' call timeout
LATE_S = 3.0  # the gateway commits the refund this long after the call reached it: past the
# timeout, within the 2 s a call may land after its deadline (the target's default lands_within)
AHEAD, BEHIND = "+2h", "-2h"


@pytest.fixture(scope="module")
def preload(tmp_path_factory: pytest.TempPathFactory) -> str:
    """LD_PRELOAD for a skewed child: the shim, then libfaketime."""
    libs = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    assert libs, "libfaketime is missing: scripts/install-faketime.sh installs Debian's faketime"
    shim = tmp_path_factory.mktemp("faketime") / "realtime_waits.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(HERE / "faketime" / "realtime_waits.c"), "-ldl"],
        check=True,
    )
    return f"{shim}:{libs[0]}"


def skewed(preload: str, offset: str | None) -> dict[str, str]:
    """The environment of a child whose wall clock is ``offset`` off (None: the real clock)."""
    return {} if offset is None else {"LD_PRELOAD": preload, "FAKETIME": offset}


class World:
    """A processor, a lookup-only gateway (no dedupe), optionally reconcilers, on fresh topics."""

    def __init__(self, cfg: KafkaConfig, tmp: Path, preload: str) -> None:
        self.cfg, self.tmp, self.preload = cfg, tmp, preload
        self.gateway = Gateway("lookup").start()
        self.targets = write_declaration(tmp / "targets.toml", self.gateway.url, "lookup")
        self.services: list[Any] = []
        self.proc: Processor | None = None

    def lands_within(self, duration: str) -> None:
        """Declare how long a cut-off call may still land (default 2 s): every process reads it."""
        with self.targets.open("a") as f:
            f.write(f'lands_within = "{duration}"\n')

    def processor(self, clock: str | None = None) -> Processor:
        p = Processor(self.cfg, self.tmp / "data")
        p.env.update(skewed(self.preload, clock))
        self.services.append(p.start())
        self.proc = p.wait_ready(WAIT)
        return p

    def reconcilers(self, clock: str | None = None) -> None:
        r = Reconcilers(self.cfg, self.tmp, ["--targets", str(self.targets)])
        r.env.update(skewed(self.preload, clock))
        self.services.append(r.start())

    def agent(
        self, host: str, run_id: str, clock: str | None = None, crash: str = "", patience: float = 3,
        timeout: float = TIMEOUT_S,
    ) -> Any:  # fmt: skip
        assert self.proc is not None
        a = run_agent(
            self.cfg, self.tmp / host, self.gateway.url, crash, run_id=run_id, timeout=timeout,
            extra=["--kind", "lookup", "--targets", str(self.targets), "--lookup", self.proc.url,
                   "--patience", str(patience)],
            env=skewed(self.preload, clock),
        )  # fmt: skip
        out, _ = a.communicate(timeout=WAIT)
        lines = out.decode(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"result": f"killed ({a.returncode})"}

    def resolve(self, key: str, clock: str | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effect_ledger", "resolve", key, "--absent", "--by", "alice", "--reason", "looked",
             "--bootstrap", self.cfg.bootstrap, "--prefix", self.cfg.prefix, "--targets", str(self.targets)],
            cwd=ROOT, env={**os.environ, **skewed(self.preload, clock)}, capture_output=True, text=True, timeout=WAIT,
        )  # fmt: skip

    def state(self, key: str) -> dict[str, Any] | None:
        assert self.proc is not None
        status, body = self.proc.lookup(key)
        return body if status == 200 else None

    def states(self, key: str) -> list[str]:
        """Every state the processor published for ``key``, in order."""
        with TopicReader(self.cfg, self.cfg.topics.state) as r:
            records = r.until(lambda rs: [x for x in rs if x.key == key.encode()], WAIT, f"states of {key}")
            return [x.value.state.value for x in records if x.value is not None]

    def refunds(self, key: str) -> int:
        return sum(1 for r in self.gateway.refunds() if r.idempotency_key == key)

    def close(self) -> None:
        for s in reversed(self.services):
            s.kill()
        self.gateway.stop()


@pytest.fixture
def world(kafka_config: KafkaConfig, tmp_path: Path, preload: str) -> Iterator[World]:
    w = World(kafka_config, tmp_path, preload)
    try:
        yield w
    except BaseException:
        for s in w.services:
            print(f"---- {s.log_path} ----\n{s.log()[-4000:]}")
        raise
    finally:
        w.close()


def key_of(run: str) -> str:
    """The demo agent's key for a run (its order id is its run id)."""
    return effect_key("payments", "refund.create", run, f"refund-order-{run}")


def late_call(w: World, run: str, clock: str | None = None) -> str:
    """An agent whose call times out while the gateway commits it LATE_S later: UNCERTAIN, landing."""
    w.gateway.state.failures.append(("late", LATE_S))
    first = w.agent("host-1", run, clock)
    assert first["result"] == "uncertain" and first["key"] == key_of(run), first
    return key_of(run)


def test_an_operator_ahead_cannot_declare_absent_while_the_call_may_land(world: World) -> None:
    # A window wide enough that the operator's command surely starts inside it on a loaded machine
    # (with the default 2 s, a slow start lands after it, where ABSENT is rightly taken).
    world.lands_within("30s")
    world.processor()
    run = f"op-ahead-{uuid.uuid4().hex[:6]}"
    key = late_call(world, run)
    r = world.resolve(key, AHEAD)  # two hours ahead: "long past the deadline", says its clock
    assert r.returncode == 1 and "still land" in r.stderr, r.stderr + r.stdout
    wait_for(lambda: world.refunds(key) == 1, WAIT, "the late call landing")
    second = world.agent("host-2", run, patience=2)
    assert world.refunds(key) == 1, f"paid twice: {second}"
    st = world.state(key)
    assert st is not None and st["state"] != State.ABSENT.value, st


def test_an_operator_behind_is_not_kept_waiting(world: World) -> None:
    world.processor()
    run = f"op-behind-{uuid.uuid4().hex[:6]}"
    first = world.agent("host-1", run, crash="after_intent")  # killed before the call: nothing sent
    assert first["result"].startswith("killed"), first
    key = key_of(run)
    wait_for(lambda: (world.state(key) or {}).get("state") == State.UNCERTAIN.value, WAIT, "the deadline passing")
    # Two hours behind, its clock says the deadline is far ahead; once the log's time is past it and
    # its lands_within, the decision is taken.
    r = wait_for(lambda: (x := world.resolve(key, BEHIND)).returncode == 0 and x, 30, "resolve --absent accepted")
    assert "effects.decisions" in r.stdout
    wait_for(lambda: (world.state(key) or {}).get("state") == State.ABSENT.value, WAIT, "ABSENT")


def test_an_agent_behind_cannot_make_absent_so_far_an_absent(world: World) -> None:
    world.processor()
    world.reconcilers()
    run = f"agent-behind-{uuid.uuid4().hex[:6]}"
    key = late_call(world, run, BEHIND)  # its intent's deadline is two hours past for everyone else
    wait_for(lambda: world.refunds(key) == 1, WAIT, "the late call landing")
    wait_for(lambda: (world.state(key) or {}).get("state") == State.CONFIRMED.value, WAIT, "the reconciler finding it")
    second = world.agent("host-2", run)
    assert world.refunds(key) == 1 and second["result"] == "confirmed" and not second["called"], second


def test_a_reconciler_ahead_waits_for_a_call_that_may_still_land(world: World) -> None:
    world.processor()
    world.reconcilers(AHEAD)
    run = f"rec-ahead-{uuid.uuid4().hex[:6]}"
    key = late_call(world, run)
    wait_for(lambda: world.refunds(key) == 1, WAIT, "the late call landing")
    wait_for(lambda: (world.state(key) or {}).get("state") == State.CONFIRMED.value, WAIT, "the reconciler finding it")
    second = world.agent("host-2", run)
    assert world.refunds(key) == 1 and second["result"] == "confirmed" and not second["called"], second
    assert State.ABSENT.value not in world.states(key)


def test_a_worker_ahead_does_not_time_a_running_call_out(world: World) -> None:
    world.processor(AHEAD)
    world.gateway.state.failures.append(("slow", 1.0))  # commits at once, answers a second later
    run = f"worker-ahead-{uuid.uuid4().hex[:6]}"
    first = world.agent("host-1", run, timeout=10)
    assert first["result"] == "confirmed" and first["called"], first
    states = world.states(first["key"])
    assert State.UNCERTAIN.value not in states and states[-1] == State.CONFIRMED.value, states


@pytest.mark.parametrize(("worker", "agent"), [(BEHIND, None), (None, AHEAD)], ids=["worker-behind", "agent-ahead"])
def test_a_deadline_passes_on_time_whatever_the_clocks(world: World, worker: str | None, agent: str | None) -> None:
    world.processor(worker)
    run = f"on-time-{uuid.uuid4().hex[:6]}"
    killed = world.agent("host-1", run, agent, crash="after_intent")
    assert killed["result"].startswith("killed"), killed
    # UNCERTAIN once the deadline (1.5 s after the intent) has passed on the log's time: within
    # seconds, not two hours late.
    wait_for(lambda: (world.state(key_of(run)) or {}).get("state") == State.UNCERTAIN.value, 30, "the deadline")
