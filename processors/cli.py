"""``effects``: the command line. Each command resolves its options, calls the public API and
prints: tables for people by default, ``--json`` for machines."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from streams.config import KafkaConfig

console = Console(highlight=False)


def _fail(message: str) -> None:
    """One line on stderr and exit 1: no traceback for an error the user can fix."""
    click.echo(f"effects: {message}", err=True)
    sys.exit(1)


kafka_options = [
    click.option(
        "--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, help="Kafka bootstrap servers [127.0.0.1:9092]"
    ),
    click.option("--prefix", envvar="EFFECTS_TOPIC_PREFIX", default=None, help="topic name prefix"),
    click.option("--partitions", envvar="EFFECTS_PARTITIONS", type=int, default=None, help="partitions per topic [6]"),
]


def with_kafka(fn: Any) -> Any:
    for opt in reversed(kafka_options):
        fn = opt(fn)
    return fn


def _kafka(bootstrap: str | None, prefix: str | None, partitions: int | None) -> KafkaConfig:
    return KafkaConfig.from_env(bootstrap=bootstrap, prefix=prefix, partitions=partitions)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="log what the services do")
def main(verbose: bool) -> None:
    """effect-ledger: an event-sourced ledger of external side effects."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")


@main.command()
@click.option("--timeout", type=float, default=2.0, show_default=True, help="the agent's call deadline, seconds")
def demo(timeout: float) -> None:
    """The refund story: a crash after the call, no double refund (no broker needed)."""
    from processors.demo.story import run_demo

    sys.exit(run_demo(console, timeout=timeout))


@main.group()
def topics() -> None:
    """Kafka topics of effect-ledger."""


@topics.command("create")
@with_kafka
def topics_create(bootstrap: str | None, prefix: str | None, partitions: int | None) -> None:
    """Create the topics (idempotent); effects.state is compacted."""
    from confluent_kafka import KafkaException

    from streams.admin import BrokerUnavailable, ensure_topics, wait_ready

    cfg = _kafka(bootstrap, prefix, partitions)
    try:
        wait_ready(cfg, timeout=10)
        result = ensure_topics(cfg)
    except (BrokerUnavailable, KafkaException, ValueError) as e:
        _fail(str(e))
    for name, what in result.items():
        click.echo(f"{name}\t{what}")


@topics.command("list")
@with_kafka
@click.option("--json", "as_json", is_flag=True, help="JSON output")
def topics_list(bootstrap: str | None, prefix: str | None, partitions: int | None, as_json: bool) -> None:
    """List the cluster's topics with their partition counts."""
    from confluent_kafka import KafkaException

    from streams.admin import BrokerUnavailable, list_topics, wait_ready

    cfg = _kafka(bootstrap, prefix, partitions)
    try:
        wait_ready(cfg, timeout=10)
        found = list_topics(cfg)
    except (BrokerUnavailable, KafkaException) as e:
        _fail(str(e))
    if as_json:
        click.echo(json.dumps(found))
        return
    table = Table("topic", "partitions")
    for name, n in found.items():
        table.add_row(name, str(n))
    console.print(table)


@main.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="the ledger file")
@click.option(
    "--reconciler",
    "reconcilers",
    multiple=True,
    metavar="TARGET=URL",
    help="an HTTP reconciler for a target, URL with {key}; repeatable",
)
@click.option("--interval", type=float, default=0.5, show_default=True, help="seconds between ticks")
@click.option("--once", is_flag=True, help="one tick, print what it did, exit")
def run(db: str, reconcilers: tuple[str, ...], interval: float, once: bool) -> None:
    """The embedded runner: fire deadlines and reconcile uncertain effects of a ledger file."""
    from processors.reconcilers import HttpReconciler
    from processors.runner import Runner
    from streams.ledger import Ledger
    from streams.reconcile import Target

    targets = []
    for spec in reconcilers:
        name, sep, url = spec.partition("=")
        if not sep or "{key}" not in url:
            _fail(f"--reconciler {spec!r}: expected TARGET=URL with {{key}} in the URL")
        targets.append(Target(name, reconciler=HttpReconciler(url, name=f"http:{name}")))

    async def go() -> None:
        async with await Ledger.open(db, targets=targets) as ledger:
            runner = Runner(ledger, interval=interval)
            if once:
                report = await runner.tick()
                click.echo(json.dumps({"timed_out": report.timed_out, "reconciled": report.reconciled}))
            else:
                await runner.run()

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass
