"""``effects demo --kafka``: the refund story through a real broker.

The agent's intent reaches ``effects.events`` before the call; the agent is killed right after
the gateway committed; the ledger processor turns the effect UNCERTAIN at its deadline; the
reconciliation consumers find the refund by key and confirm it; the agent, restarted on another
host with an empty disk, asks the processor and gets the original receipt. Every state change is
read live from the intermediate-state stream ``effects.state``.
"""

from __future__ import annotations

import shlex
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer
from rich.console import Console
from rich.table import Table

from effect_ledger.core.model import State
from effect_ledger.demo.agent import write_declaration
from effect_ledger.demo.gateway import Gateway
from effect_ledger.demo.story import _agent, _exit_text
from effect_ledger.processors.supervise import Processor, Reconcilers
from effect_ledger.sdk import crashpoints
from effect_ledger.streams.admin import BrokerUnavailable, delete_topics, ensure_topics, list_topics, wait_ready
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig


class StateWatcher(threading.Thread):
    """Follows effects.state and prints each state change, as an operator's subscription would."""

    def __init__(self, cfg: KafkaConfig, console: Console) -> None:
        super().__init__(daemon=True, name="state-watcher")
        self.cfg = cfg
        self.console = console
        self.states: list[str] = []
        self.changed = threading.Condition()
        self._stop_flag = threading.Event()

    def run(self) -> None:
        codec = default_codec()
        c = Consumer(self.cfg.confluent(**{"group.id": f"demo-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"}))
        c.subscribe([self.cfg.topics.state])
        try:
            while not self._stop_flag.is_set():
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                st = codec.decode(m.value())
                with self.changed:
                    if not self.states or self.states[-1] != st.state.value:
                        self.states.append(st.state.value)
                        self.console.print(
                            f"   [dim]effects.state[/] {st.effect_id[:24]}… -> [bold]{st.state.value}[/]"
                            f"{' (' + st.reason + ')' if st.reason else ''}"
                        )
                    self.changed.notify_all()
        finally:
            c.close()

    def wait_for(self, state: State, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: state.value in self.states, timeout)

    def stop(self) -> None:
        self._stop_flag.set()


def kafka_next_steps(cfg: KafkaConfig, key: str | None, since_ms: int) -> list[str]:
    """What to run on the topics a kept demo leaves, as a shell takes it."""
    from effect_ledger.core.timeparse import iso
    from effect_ledger.demo.story import program

    q, effects = shlex.quote, program()  # as the shell reaches it: `.venv/bin/effects` when not on PATH
    where = f"--bootstrap {q(cfg.bootstrap)} --prefix {q(cfg.prefix)}"
    steps = [f"{effects} tail {where} --from-beginning"]
    if key:
        steps.append(f"{effects} trace {q(key)} {where}")
    steps.append(f"{effects} audit {where} --from {q(iso(since_ms))}")
    return steps


def run_kafka_demo(
    console: Console,
    bootstrap: str | None = None,
    timeout: float = 2.0,
    broker_timeout: float = 10.0,
    keep: bool = False,
) -> int:
    """The refund story through Kafka; returns the exit status. ``BrokerUnavailable`` when no broker
    answers within ``broker_timeout`` s (the command line prints it as its one line). ``keep`` leaves
    the demo's topics on the broker (the services stop: the topics hold everything they wrote) and
    prints the commands that read them."""
    started = time.monotonic()
    since_ms = time.time_ns() // 1_000_000 - 1000
    cfg = KafkaConfig.from_env(bootstrap=bootstrap, prefix=f"demo{uuid.uuid4().hex[:8]}.", partitions=3)
    try:
        wait_ready(cfg, timeout=broker_timeout)
    except BrokerUnavailable as e:  # the command line's one line on stderr, exit 1
        raise BrokerUnavailable(f"{e}; start one with `make kafka-up` (or `docker compose up -d kafka`)") from None
    ensure_topics(cfg)
    console.rule("[bold]effect-ledger demo through Kafka: a refund, a crash, a restart on another host")
    console.print(f"Broker {cfg.bootstrap}, topics {cfg.prefix}effects.*\n")
    watcher = StateWatcher(cfg, console)
    with tempfile.TemporaryDirectory(prefix="effect-ledger-kafka-demo-") as tmp, Gateway("key+lookup") as gw:
        processor = Processor(cfg, Path(tmp, "processor")).start()
        # One declaration of the gateway, read by the agents and by the reconcilers alike.
        targets = str(write_declaration(Path(tmp, "targets.toml"), gw.url, "key+lookup"))
        reconcilers = Reconcilers(cfg, Path(tmp), ["--targets", targets])
        try:
            console.print("Starting the ledger processor (effects worker) and the reconcilers (effects reconcile) ...")
            processor.wait_ready()
            reconcilers.start()
            watcher.start()
            console.print(f"Gateway on {gw.url}; the operator follows effects.state.\n")

            kafka_args = ["--kafka", cfg.bootstrap, "--prefix", cfg.prefix, "--lookup", processor.url]
            kafka_args += ["--targets", targets]
            host_a, host_b = Path(tmp, "host-a"), Path(tmp, "host-b")
            host_a.mkdir()
            host_b.mkdir()
            console.print("[bold]host-a[/]: the agent writes its intent to Kafka, then refunds 4,800 with the key")
            code, _ = _agent("ledger", host_a, gw.url, crashpoints.AFTER_CALL, timeout, kafka_args)
            console.print(f"   agent on host-a: {_exit_text(code)} at [bold]after_call[/] (host-a's disk is gone)")
            ok_state = watcher.wait_for(State.CONFIRMED, timeout + 30)
            console.print("[bold]host-b[/]: the agent restarts with an empty disk and asks the processor first")
            code, out = _agent("ledger", host_b, gw.url, None, timeout, kafka_args)
            called = "called the gateway again" if out.get("called") else "did not call the gateway"
            console.print(f"   agent on host-b: receipt [bold]{out.get('receipt_id')}[/]; it {called}")
            refunds = gw.refunds()
            table = Table(title="One logical refund, through Kafka")
            table.add_column("refunds at the gateway", justify="right")
            table.add_column("paid", justify="right")
            table.add_column("effects.state")
            table.add_row(str(len(refunds)), f"{sum(r.amount for r in refunds):,}", " -> ".join(watcher.states))
            console.print(table)
            ok = ok_state and len(refunds) == 1 and out.get("result") == "confirmed" and not out.get("called")
            elapsed = time.monotonic() - started
            if ok:
                console.print(
                    f"[green]One refund: recorded on Kafka, reconciled by the consumers, returned on "
                    f"another host.[/] ({elapsed:.1f} s)"
                )
                if keep:
                    console.print(f"\nThe topics {cfg.prefix}effects.* stay on {cfg.bootstrap}. To try on them:")
                    for step in kafka_next_steps(cfg, out.get("key"), since_ms):
                        console.print(f"  {step}", soft_wrap=True)
                    console.print(
                        "Stop the repo's broker with `make kafka-down` (its data, these topics included, stays "
                        "in .kafka/data until that folder is removed); on a broker of your own, delete the "
                        f"topics named {cfg.prefix}* with your Kafka tools.",
                        soft_wrap=True,
                    )
                return 0
            console.print(
                f"[red]The demo did not go as told[/]: refunds={len(refunds)}, agent={out}, "
                f"states={watcher.states}\n{processor.log()[-2000:]}"
            )
            return 1
        finally:
            watcher.stop()
            reconcilers.stop()
            processor.stop()
            if not keep:
                delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])
