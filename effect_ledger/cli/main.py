"""``effects``: the command line. Each command resolves its options, calls the public API and
prints: tables for people by default, ``--json`` for machines."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

import click

from effect_ledger._extras import require
from effect_ledger.cli._boundary import (
    PORT,
    POSITIVE_SECONDS,
    STORE_URL,
    EffectsGroup,
    LedgerPath,
    Seconds,
    broker_wait,
    configure,
    fail,
)
from effect_ledger.cli._shared import (
    bootstrap_option,
    kafka_config,
    min_isr_option,
    out,
    print_table,
    ready,
    service_log_options,
    start_logging,
    table,
    topic_options,
    wide_option,
)
from effect_ledger.cli.acl import names_options
from effect_ledger.streams.acl import RECONCILER_GROUP, WORKER_APP_ID
from effect_ledger.streams.config import KafkaConfig

console = out  # the demos print through the commands' one console


def metrics_options(fn: Any) -> Any:
    """``--metrics-port`` / ``--metrics-host`` / ``--metrics-token``: serve Prometheus ``/metrics``
    (the [metrics] extra); beyond loopback only with the token."""
    fn = click.option(
        "--metrics-token",
        envvar="EFFECTS_METRICS_TOKEN",
        default=None,
        help="scrapers must send 'Authorization: Bearer TOKEN'; needed beyond loopback [env EFFECTS_METRICS_TOKEN]",
    )(fn)
    fn = click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        help="address /metrics listens on; beyond loopback it needs --metrics-token",
    )(fn)
    return click.option(
        "--metrics-port", type=PORT, default=None, help="serve Prometheus /metrics on this port (needs [metrics])"
    )(fn)


def _metrics(port: int | None, host: str, feature: str, token: str | None) -> Any:
    """The process's ``LedgerMetrics``, served on ``host:port``; ``None`` without a port. Checked
    before anything else starts: a missing extra, a port in use or an address beyond loopback
    without a token is one line and exit 1."""
    if port is None:
        return None
    from effect_ledger.metrics.names import LedgerMetrics

    m = LedgerMetrics(feature=feature)  # a LedgerError ends the command at the boundary
    m.serve(port, host, token or None)
    return m


@click.group(cls=EffectsGroup, name="effects")
@click.option("-v", "--verbose", is_flag=True, help="log what the services do (and an unexpected error's traceback)")
@click.option(
    "--broker-timeout",
    type=POSITIVE_SECONDS,
    envvar="EFFECTS_BROKER_TIMEOUT",
    default=None,
    metavar="SECONDS",
    help="how long a command waits for a Kafka broker before it gives up [each command's own: 5-30 s]",
)
@click.option(
    "--schema-registry",
    envvar="EFFECTS_SCHEMA_REGISTRY",
    default=None,
    metavar="URL",
    help="a Confluent-compatible Schema Registry: register the schemas there and frame records the registry way",
)
def main(verbose: bool, broker_timeout: float | None, schema_registry: str | None) -> None:
    """effect-ledger: an event-sourced ledger of external side effects.

    Every error is one line on stderr and exit status 1."""
    configure(verbose, broker_timeout)
    if schema_registry:  # every command's KafkaConfig.from_env reads it
        os.environ["EFFECTS_SCHEMA_REGISTRY"] = schema_registry
    from effect_ledger.metrics import logs

    logs.setup("text", verbose=verbose)  # the services set their own format (--log-format) on it


@main.command()
@click.option(
    "--timeout", type=POSITIVE_SECONDS, default=2.0, show_default=True, help="the agent's call deadline, seconds"
)
@click.option("--kafka", "kafka", is_flag=True, help="through a real broker, processor and reconcilers")
@bootstrap_option
@click.option(
    "--db",
    default="effects-demo.db",
    show_default=True,
    type=LedgerPath(),
    help="embedded: where the demo leaves its ledger file (an earlier demo's file there is replaced; any "
    "other file is refused and left as it is)",
)
@click.option("--keep", is_flag=True, help="--kafka: leave the topics (and the broker) up for effects tail and replays")
def demo(timeout: float, kafka: bool, bootstrap: str | None, db: str, keep: bool) -> None:
    """The refund story: a crash after the call, no double refund (embedded: no broker needed). It
    ends with three commands to try on what it recorded."""
    if kafka:
        require("processor", "demo --kafka")  # it starts a processor: say so before anything runs
        from effect_ledger.demo.story_kafka import run_kafka_demo

        sys.exit(run_kafka_demo(console, bootstrap, timeout=timeout, broker_timeout=broker_wait(10), keep=keep))
    from effect_ledger.demo.story import run_demo

    sys.exit(run_demo(console, timeout=timeout, keep=db))


@main.group()
def topics() -> None:
    """Kafka topics of effect-ledger."""


@topics.command("create")
@topic_options
@min_isr_option
def topics_create(bootstrap: str | None, prefix: str | None, partitions: int | None, min_isr: int | None) -> None:
    """Create the topics that are missing (idempotent): effects.state compacted, the event log kept
    for ever, min.insync.replicas on every topic. A topic that exists with other settings is not
    "ok": each difference is one line, and the exit status is 1."""
    from effect_ledger.streams.admin import check_topics, ensure_topics

    cfg = ready(kafka_config(bootstrap, prefix, partitions, min_isr), 10)
    created = ensure_topics(cfg, check_partitions=False)
    drifted = False
    for st in check_topics(cfg):
        what = created.get(st.spec.name, "exists")
        if st.drifts:
            drifted = True
            click.echo(f"{st.spec.name}\t{what}, DRIFTED: " + "; ".join(d.line() for d in st.drifts))
        else:
            click.echo(f"{st.spec.name}\t{what}")
    if drifted:
        fail("topics exist with settings effect-ledger does not expect (above; `effects topics check` lists them)")


@topics.command("check")
@topic_options
@min_isr_option
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.option(
    "--role", "roles", multiple=True, metavar="ROLE=PRINCIPAL",
    help="also compare the principal's ACLs with its role's rights (`effects acl`); repeat",
)  # fmt: skip
@names_options
def topics_check(
    bootstrap: str | None,
    prefix: str | None,
    partitions: int | None,
    min_isr: int | None,
    as_json: bool,
    roles: tuple[str, ...],
    app_id: str,
    reconciler_group: str,
) -> None:
    """Compare every topic's partitions, replication, cleanup policy, retention and
    min.insync.replicas with what effect-ledger expects; with --role, each principal's ACLs with
    its role's rights too (a missing right and an excess one are both differences; needs Describe
    on the cluster). Exit 0 with a table when all is right; exit 1 with one line per difference
    on stderr otherwise."""
    from effect_ledger.streams.admin import CHECKED_CONFIGS, check_topics

    cfg = ready(kafka_config(bootstrap, prefix, partitions, min_isr), 10)
    statuses = check_topics(cfg)
    drifts: list[object] = [d for st in statuses for d in st.drifts]
    if roles:
        from effect_ledger.streams import rights
        from effect_ledger.streams.acl import grants, parse_roles

        named = grants(parse_roles(roles), cfg.topics, app_id=app_id, reconciler_group=reconciler_group)
        for c in rights.compare(cfg, named):
            who = f"{c.principal} ({c.role})"
            drifts += [f"{who} lacks {r.operation} on {r.resource} {r.name} ({r.pattern})" for r in c.missing]
            drifts += [
                f"{who} has {r.operation} on {r.resource} {r.name} ({r.pattern}), beyond its role" for r in c.excess
            ]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "topic": st.spec.name,
                        "exists": st.exists,
                        "partitions": st.partitions,
                        "replication": st.replication,
                        "config": st.config,
                        "expected": {
                            "partitions": st.spec.partitions,
                            "replication": st.spec.replication,
                            **st.spec.config,
                        },
                        "drifts": [str(d) for d in st.drifts],
                    }
                    for st in statuses
                ],
                indent=2,
            )
        )
    elif not drifts:
        t = table(None, "topic", "partitions", "replication", *CHECKED_CONFIGS, "")
        for st in statuses:
            t.add_row(st.spec.name, str(st.partitions), str(st.replication),
                      *(st.config.get(k, "-") for k in CHECKED_CONFIGS), "ok")  # fmt: skip
        print_table(t)
    for d in drifts:
        click.echo(f"effects: {d}", err=True)
    sys.exit(1 if drifts else 0)


@topics.command("list")
@topic_options
@click.option("--json", "as_json", is_flag=True, help="JSON output")
def topics_list(bootstrap: str | None, prefix: str | None, partitions: int | None, as_json: bool) -> None:
    """List the cluster's topics with their partition counts."""
    from effect_ledger.streams.admin import list_topics

    found = list_topics(ready(kafka_config(bootstrap, prefix, partitions), 10))
    if as_json:
        click.echo(json.dumps(found))
        return
    t = table(None, "topic", "partitions")
    for name, n in found.items():
        t.add_row(name, str(n))
    print_table(t)


def target_options(fn: Any) -> Any:
    # Required, but checked in _targets rather than by click: a missing declaration is then one
    # line and exit 1, like a malformed one, instead of click's usage text and exit 2.
    return click.option(
        "--targets",
        "targets_spec",
        metavar="FILE",
        envvar="EFFECTS_TARGETS",
        help="the targets declaration (required): a TOML file, or package.module:NAME [env EFFECTS_TARGETS]",
    )(fn)


def _targets(spec: str | None) -> dict[str, Any]:
    """The declared targets by name; a missing or malformed declaration ends the command (exit 1)
    before anything is opened or connected."""
    from effect_ledger.errors import TargetsError
    from effect_ledger.targets.load import load_targets

    if not spec:
        fail(
            "no targets declared: give --targets FILE or set EFFECTS_TARGETS (a TOML file saying how "
            'each destination is asked; lookup = "none" where nothing can ask it)'
        )
    try:
        return {t.name: t for t in load_targets(spec)}
    except TargetsError as e:
        fail(str(e))


@main.command()
@click.option("--db", required=True, type=LedgerPath(), help="the ledger file")
@target_options
@click.option("--interval", type=POSITIVE_SECONDS, default=0.5, show_default=True, help="seconds between ticks")
@click.option("--once", is_flag=True, help="one tick, print what it did, exit")
@metrics_options
@service_log_options
def run(
    db: str,
    targets_spec: str | None,
    interval: float,
    once: bool,
    metrics_port: int | None,
    metrics_host: str,
    metrics_token: str | None,
    log_format: str,
    log_summary: float,
) -> None:
    """The embedded runner: fire deadlines and reconcile uncertain effects of a ledger file."""
    targets = list(_targets(targets_spec).values())
    metrics = _metrics(metrics_port, metrics_host, "effects run --metrics-port", metrics_token)
    from effect_ledger.sdk.ledger import Ledger
    from effect_ledger.sdk.runner import Runner

    start_logging("run", log_format)

    async def go() -> None:
        async with await Ledger.open(db, targets=targets) as ledger:
            runner = Runner(ledger, interval=interval, metrics=metrics, summary_every=log_summary)
            if once:  # one tick is a command, not a service: its answer is the JSON on stdout
                report = await runner.tick()
                click.echo(json.dumps({"timed_out": report.timed_out, "reconciled": report.reconciled}))
                return
            _started(
                "embedded runner firing deadlines and reconciling",
                f"ledger file {db}, every {interval:g} s",
                db=db,
                interval_s=interval,
                targets=sorted(t.name for t in targets),
                metrics=f"{metrics_host}:{metrics_port}" if metrics_port else None,
            )
            # SIGTERM (a supervisor) and SIGINT (Ctrl-C) let the tick in progress finish, then stop:
            # never a tick cut in the middle, and the summary is said either way.
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            try:
                await runner.run(stop)
            finally:
                runner.summary.emit()

    try:
        asyncio.run(go())  # a missing folder or a file that is not a ledger: one line at the boundary
    except KeyboardInterrupt:
        pass


@main.command()
@topic_options
@min_isr_option
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default="./effect-ledger-data",
    show_default=True,
    help="where the table's RocksDB files live",
)
@click.option("--store", type=STORE_URL, default="rocksdb://", show_default=True, help="table store")
@click.option(
    "--web-host",
    default="127.0.0.1",
    show_default=True,
    help="address the lookup view listens on; beyond loopback (e.g. 0.0.0.0) it needs --web-token",
)
@click.option("--web-port", type=PORT, default=6066, show_default=True, help="port of the lookup view")
@click.option(
    "--web-token",
    envvar="EFFECTS_WEB_TOKEN",
    show_envvar=True,
    default=None,
    help="lookups must carry 'Authorization: Bearer TOKEN' (prefer the environment variable: argv is visible)",
)
@click.option("--advertised-url", default=None, help="URL other workers use to reach this one [http://HOST:PORT]")
@click.option("--app-id", default=WORKER_APP_ID, show_default=True, help="consumer group / app id (after the prefix)")
@click.option(
    "--loglevel",
    # a Choice: a bad level is click's one line before connecting, not faust's traceback after
    type=click.Choice(("critical", "error", "warning", "info", "debug"), case_sensitive=False),
    default="warning",
    show_default=True,
)
@click.option(
    "--targets",
    "targets_spec",
    metavar="FILE",
    envvar="EFFECTS_TARGETS",
    help="the targets declaration: each target's backoff spaces the checks of its uncertain effects "
    "(without it, the default backoff for every target) [env EFFECTS_TARGETS]",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="workers to run on this machine, one process each, sharing the partitions (DATA_DIR/worker-I, "
    "port + I); one per core, at most one per partition",
)
@click.option(
    "--drain-timeout",
    "drain_s",
    type=Seconds(0.1, 3600),
    default=None,
    metavar="SECONDS",
    help="how long a worker whose partitions are revoked, or that is told to stop, waits for Kafka to "
    "acknowledge the batch it is writing (its next owner reads the changelog once it lets go) "
    "[default: half the group's rebalance timeout, 30]",
)
@metrics_options
@service_log_options
def worker(
    bootstrap: str | None,
    prefix: str | None,
    partitions: int | None,
    min_isr: int | None,
    data_dir: str,
    store: str,
    web_host: str,
    web_port: int,
    web_token: str | None,
    advertised_url: str | None,
    app_id: str,
    loglevel: str,
    targets_spec: str | None,
    processes: int,
    drain_s: float | None,
    metrics_port: int | None,
    metrics_host: str,
    metrics_token: str | None,
    log_format: str,
    log_summary: float,
) -> None:
    """The ledger processor: fold effects.events into the table, publish effects.state and
    effects.uncertain, fire deadlines, serve lookups. Runs until SIGTERM/SIGINT."""
    from pathlib import Path

    from effect_ledger.processors.processor import ProcessorSettings
    from effect_ledger.processors.worker import run_worker
    from effect_ledger.streams.admin import ensure_topics, for_this_cluster, require_topics

    targets = _targets(targets_spec) if targets_spec else {}  # a bad file: one line, before anything starts
    cfg = KafkaConfig.from_env(bootstrap=bootstrap, prefix=prefix, partitions=partitions, min_insync_replicas=min_isr)
    settings = ProcessorSettings(
        kafka=cfg,
        targets=targets,
        app_id=app_id,
        data_dir=Path(data_dir),
        store=store,
        web_host=web_host,
        web_port=web_port,
        web_token=web_token or None,
        advertised_url=advertised_url,
    )
    if drain_s is not None:
        settings.drain_s = drain_s
    settings.summary_s, settings.log_format = log_summary, log_format
    start_logging("worker", log_format)
    settings.check_web()  # before anything is contacted or started
    if metrics_port is not None:  # likewise (and once, not by each worker of --processes)
        from effect_ledger.metrics.http import check_exposure

        check_exposure(metrics_host, metrics_token)
    # Replicated like a production cluster as soon as there are brokers to replicate to (unless
    # EFFECTS_REPLICATION says otherwise): the topics and the processor's own.
    settings.kafka = cfg = for_this_cluster(cfg, broker_wait(30))
    from effect_ledger.streams import rights

    # A right the worker lacks is one line naming it, not a worker that looks ready and folds nothing.
    rights.require(cfg, "worker", "effects worker")
    ensure_topics(cfg)
    # A drifted effects.state (not compacted, ...) or partition count: one line, nothing started.
    require_topics(cfg)
    if processes > 1:
        from effect_ledger.processors.worker_pool import run_pool

        if advertised_url:
            fail("--advertised-url names one worker: with --processes, each worker is reached on its own port")
        sys.exit(run_pool(settings, processes, loglevel, metrics_port, metrics_host, metrics_token))
    metrics = _metrics(metrics_port, metrics_host, "effects worker --metrics-port", metrics_token)
    run_worker(settings, loglevel=loglevel, metrics=metrics)


@main.command()
@topic_options
@target_options
@click.option("--group", default=RECONCILER_GROUP, show_default=True, help="consumer group (after the prefix)")
@metrics_options
@service_log_options
def reconcile(
    bootstrap: str | None,
    prefix: str | None,
    partitions: int | None,
    targets_spec: str | None,
    group: str,
    metrics_port: int | None,
    metrics_host: str,
    metrics_token: str | None,
    log_format: str,
    log_summary: float,
) -> None:
    """Reconciliation consumers: ask destinations about uncertain effects, write resolutions.
    Start several: they share effects.uncertain's partitions. Runs until SIGTERM/SIGINT."""
    targets = _targets(targets_spec)  # before anything is imported, opened or connected

    from effect_ledger.processors.reconcile_service import ReconcileService

    start_logging("reconcile", log_format)
    cfg = ready(KafkaConfig.from_env(bootstrap=bootstrap, prefix=prefix, partitions=partitions), 30)
    from effect_ledger.streams import rights

    rights.require(cfg, "reconciler", "effects reconcile")
    metrics = _metrics(metrics_port, metrics_host, "effects reconcile --metrics-port", metrics_token)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        service = ReconcileService(cfg, targets, group=group, metrics=metrics, summary_s=log_summary)
        _started(
            "reconcilers asking destinations about uncertain effects",
            f"{cfg.topics.uncertain} from {cfg.bootstrap} (group {service.group}), answers to {cfg.topics.events}",
            bootstrap=cfg.bootstrap,
            topics=[cfg.topics.uncertain, cfg.topics.events],
            group=service.group,
            targets=sorted(targets),
            metrics=f"{metrics_host}:{metrics_port}" if metrics_port else None,
        )
        await service.run(stop)

    asyncio.run(go())


@main.command()
@click.option("--db", required=True, type=LedgerPath(exists=True), help="the ledger file (outbox)")
@topic_options
@click.option(
    "--refused", is_flag=True,
    help="list the rows Kafka refused for good and the relay set aside (no broker needed), then exit",
)  # fmt: skip
@click.option(
    "--resend-refused", is_flag=True,
    help="first put the rows Kafka's ACLs refused back in the outbox (once the right is given), then relay",
)  # fmt: skip
@wide_option
@service_log_options
def relay(
    db: str,
    bootstrap: str | None,
    prefix: str | None,
    partitions: int | None,
    refused: bool,
    resend_refused: bool,
    wide: bool,
    log_format: str,
    log_summary: float,
) -> None:
    """Send what an outbox holds that Kafka has not acknowledged (e.g. left by a dead agent), then exit.
    A row Kafka refuses for good (too large, invalid, or refused by its ACLs) is set aside with its
    reason and the rows behind it go on; --refused lists those rows."""
    if refused:
        from effect_ledger.core.timeparse import iso
        from effect_ledger.ops.views import read_only

        with read_only(db) as reader:
            rows = reader.set_aside()
        t = table(None, "seq", "effect", "kind", "set aside", "reason")
        for r in rows:
            t.add_row(str(r["seq"]), r["effect_id"], r["kind"], iso(r["at_ms"]), r["reason"])
        print_table(t, wide)
        click.echo(f"{len(rows)} rows set aside in {db}")
        return
    from rich.progress import Progress

    from effect_ledger.sdk.kafka.relay import Relay
    from effect_ledger.sdk.store.sqlite import Store

    cfg = KafkaConfig.from_env(bootstrap=bootstrap, prefix=prefix, partitions=partitions)
    start_logging("relay", log_format)

    async def go() -> tuple[int, int]:
        store = await Store.open(db)  # a file that is not a ledger is refused before a broker is asked
        try:
            await asyncio.to_thread(ready, cfg, 30)
            from effect_ledger.streams import rights

            # Another role's credential would have every row refused and set aside: say so instead.
            await asyncio.to_thread(rights.require, cfg, "agent", "effects relay")
            if resend_refused:
                back = await store.resend_refused()
                click.echo(f"{back} rows refused by Kafka's ACLs put back in the outbox")
            pending = await store.outbox_depth()
            _started(
                "relay sending an outbox's unacknowledged events",
                f"{pending} events from {db} to {cfg.topics.events} on {cfg.bootstrap}",
                db=db, bootstrap=cfg.bootstrap, topics=[cfg.topics.events], pending=pending,
            )  # fmt: skip
            from effect_ledger.metrics.logs import Summary

            summary = Summary(logging.getLogger("effect_ledger.relay"), log_summary)
            counted = [0]

            def sent_so_far(n: int) -> None:
                progress.update(task, completed=n)
                summary.count("events_sent", n - counted[0])
                counted[0] = n
                summary.tick(pending=max(0, pending - n))

            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("relaying", total=pending)
                relay = Relay(store, cfg)
                sent = await relay.drain(sent_so_far)
            summary.count("events_sent", sent - counted[0])
            summary.count("dead_letters", relay.stats.dead_letters)
            summary.emit()
            return sent, relay.stats.dead_letters
        finally:
            await store.close()

    sent, dead = asyncio.run(go())
    click.echo(f"relayed {sent} events from {db} to {cfg.topics.events}")
    if dead:
        # Refused by Kafka for good (too large, invalid): kept in the file's dead_letters table.
        click.echo(
            f"dead-lettered {dead} events Kafka refused (reasons in the dead_letters table, copies on {cfg.topics.dlq})"
        )


def _started(what: str, where: str, **fields: Any) -> None:
    """A service's one start line: what it serves, where (``effect_ledger.metrics.logs``)."""
    from effect_ledger.metrics import logs

    logs.started(logging.getLogger("effect_ledger.service"), f"{what}: {where}", **fields)


def _register_ops() -> None:
    from effect_ledger.cli.acl import acl_command
    from effect_ledger.cli.assess import assess_command
    from effect_ledger.cli.console import console_command
    from effect_ledger.cli.init import init_command
    from effect_ledger.cli.mcp import mcp_proxy
    from effect_ledger.cli.ops import register
    from effect_ledger.cli.retention import register as register_retention

    register(main)
    register_retention(main)
    main.add_command(mcp_proxy)
    main.add_command(assess_command)
    main.add_command(console_command)
    main.add_command(acl_command)
    main.add_command(init_command)


_register_ops()

if __name__ == "__main__":
    main()
