"""``effects audit | trace | stuck | tail | escalations | resolve | sink``: the operator and
auditor commands. Each reads an embedded ledger (``--db FILE``) or the Kafka topics (the Kafka
options), calls ``effect_ledger.processors.ops`` and prints a table, or JSON/CSV for machines."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from effect_ledger.processors.cli_boundary import POSITIVE_SECONDS, LedgerPath, broker_wait, kafka_log_level
from effect_ledger.processors.ops.sources import SourceError
from effect_ledger.streams.admin import BrokerUnavailable, wait_ready
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.errors import LedgerError
from effect_ledger.streams.timeparse import TimeSpecError, duration_ms, iso, time_ms

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

EXIT_ERROR = 1
EXIT_FOUND = 3  # `stuck` found effects: page someone
EXIT_PAGE_FAILED = 4  # `stuck --webhook` found effects and the page was not delivered


def fail(message: str) -> None:
    click.echo(f"effects: {message}", err=True)
    sys.exit(EXIT_ERROR)


@contextmanager
def user_errors() -> Iterator[None]:
    """Errors a user can fix become one line on stderr and exit 1, never a traceback."""
    try:
        yield
    except (SourceError, TimeSpecError, BrokerUnavailable, LedgerError, ValueError) as e:
        fail(str(e))
    except Exception as e:
        if not _is_kafka_exception(e):
            raise
        fail(f"Kafka: {e.args[0].str() if e.args else e}")


def _is_kafka_exception(e: Exception) -> bool:
    # confluent-kafka is optional (the [kafka] extra): if it was never imported, nothing raised
    # one of its exceptions, and the embedded commands must not import it just to ask.
    ck = sys.modules.get("confluent_kafka")
    return ck is not None and isinstance(e, ck.KafkaException)


def source_options(fn: Any) -> Any:
    for opt in reversed(
        [
            click.option(
                "--db", type=LedgerPath(), default=None, help="an embedded ledger file instead of Kafka"
            ),
            click.option(
                "--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, help="Kafka bootstrap servers [127.0.0.1:9092]"
            ),
            click.option("--prefix", envvar="EFFECTS_TOPIC_PREFIX", default=None, help="topic name prefix"),
        ]
    ):
        fn = opt(fn)
    return fn


def kafka_config(bootstrap: str | None, prefix: str | None) -> KafkaConfig:
    """The operator commands' Kafka settings: librdkafka's own logging quiet unless ``-v``."""
    return KafkaConfig.from_env(bootstrap=bootstrap, prefix=prefix, log_level=kafka_log_level())


def kafka_of(bootstrap: str | None, prefix: str | None) -> KafkaConfig:
    cfg = kafka_config(bootstrap, prefix)
    wait_ready(cfg, timeout=broker_wait(5))
    return cfg


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as p:
        task = p.add_task(label, total=None)
        yield lambda done, total: p.update(task, completed=done, total=total)


def register(main: click.Group) -> None:
    main.add_command(audit)
    main.add_command(trace)
    main.add_command(stuck)
    main.add_command(tail)
    main.add_command(escalations)
    main.add_command(resolve)
    main.add_command(sink)


@click.command()
@source_options
@click.option("--from", "from_", required=True, help="window start: ISO time, epoch ms, now, or -1h")
@click.option("--to", "to", default="now", show_default=True, help="window end")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output")
@click.option("--stuck-after", default="10m", show_default=True, help="what counts as stuck")
@click.option("--fail-on-check", is_flag=True, help="exit 3 when a check fails")
def audit(
    db: str | None,
    bootstrap: str | None,
    prefix: str | None,
    from_: str,
    to: str,
    as_json: bool,
    as_csv: bool,
    stuck_after: str,
    fail_on_check: bool,
) -> None:
    """Replay effects.events for a window, fold it fresh, and check it: keyed writes, recorded
    outcomes, receipts, uncertain, resolved by reconciliation, duplicates, stuck, and the
    sent-but-unrecorded window (p50/p99/max), overall and per target."""
    from effect_ledger.processors.ops.audit import audit as run_audit
    from effect_ledger.processors.ops.sources import db_events, replay_events
    from effect_ledger.processors.ops.views import now_ms

    with user_errors():
        now = now_ms()
        start, end = time_ms(from_, now), time_ms(to, now)
        if start >= end:
            raise TimeSpecError(f"empty window: --from {iso(start)} is not before --to {iso(end)}")
        stuck_ms = duration_ms(stuck_after)
        with progress_bar("replaying effects.events") as progress:
            if db is not None:
                records = db_events(db, start, end)
            else:
                records = replay_events(kafka_of(bootstrap, prefix), start, progress, end)
            report = run_audit(records, start, end, now, stuck_ms)
    if as_json:
        click.echo(report.to_json())
    elif as_csv:
        click.echo(report.to_csv(), nl=False)
    else:
        t = Table(title=f"audit {iso(start)} .. {iso(end)}: {report.events:,} events", title_justify="left")
        t.add_column("check", no_wrap=True)
        for col in ("numerator", "denominator", "ratio"):
            t.add_column(col, justify="right")
        t.add_column("criterion")
        t.add_column("result", no_wrap=True)
        for c in report.checks:
            result = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
            t.add_row(c.name, f"{c.numerator:,}", f"{c.denominator:,}", c.ratio, c.criterion, result)
        out.print(t)
        for c in report.checks:
            if c.detail:
                out.print(f"{c.name}: {c.detail}")
        tt = Table(title="per target", title_justify="left")
        for col in ("target", "effects", "keyed", "uncertain", "resolved", "duplicates", "stuck", "window p99 ms"):
            tt.add_column(col, justify="left" if col == "target" else "right", no_wrap=col == "target")
        for r in report.targets:
            tt.add_row(
                r.target,
                f"{r.effects:,}",
                f"{r.keyed:,}/{r.attempts:,}",
                f"{r.uncertain:,}",
                f"{r.resolved:,}",
                f"{r.duplicates:,}",
                f"{r.stuck:,}",
                "-" if r.window_p99_ms is None else f"{r.window_p99_ms:.0f}",
            )
        out.print(tt)
        notes = []
        if report.continuing:
            notes.append(
                f"{report.continuing:,} effects began before the window and are left out (but for their duplicates)"
            )
        if report.duplicate_keys:
            notes.append("duplicates: " + ", ".join(report.duplicate_keys[:10]))
        for n in notes:
            out.print(f"[dim]{n}[/]")
    if fail_on_check and not report.passed:
        sys.exit(EXIT_FOUND)


@click.command()
@click.argument("key")
@source_options
@click.option("--json", "as_json", is_flag=True, help="JSON output")
def trace(key: str, db: str | None, bootstrap: str | None, prefix: str | None, as_json: bool) -> None:
    """The timeline of one effect: every event with its time and source, the windows, the state."""
    from effect_ledger.processors.ops.views import trace as run_trace

    with user_errors():
        cfg = None if db is not None else kafka_of(bootstrap, prefix)
        t = run_trace(key, db=db, cfg=cfg)
        if t.effect is None:
            raise SourceError(f"no effect with key {key!r}")
    e = t.effect
    if as_json:
        click.echo(
            json.dumps(
                {
                    "effect_id": key,
                    "state": e.state.value,
                    "attempt": e.attempt,
                    "reason": e.reason,
                    "flags": [f.value for f in e.flags],
                    "receipt_id": e.receipt.receipt_id if e.receipt else None,
                    "sent_unrecorded_ms": t.sent_unrecorded_ms,
                    "intermediate_ms": t.intermediate_ms,
                    "events": [
                        {
                            "at": iso(ln.at_ms),
                            "at_ms": ln.at_ms,
                            "event": ln.event,
                            "source": ln.source,
                            "state_after": ln.state_after,
                        }
                        for ln in t.lines
                    ],
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"effect {key}", title_justify="left")
    for col in ("time (UTC)", "+s", "event", "source", "state after"):
        table.add_column(col)
    t0 = t.lines[0].at_ms if t.lines else 0
    for ln in t.lines:
        table.add_row(iso(ln.at_ms), f"{(ln.at_ms - t0) / 1000:.3f}", ln.event, ln.source, ln.state_after)
    out.print(table)
    out.print(
        f"state: [bold]{e.state.value}[/]{' (' + e.reason + ')' if e.reason else ''}; attempt {e.attempt}; "
        f"flags: {', '.join(f.value for f in e.flags) or 'none'}"
    )
    windows = ", ".join(f"{w} ms" for w in t.sent_unrecorded_ms) or "no execution recorded"
    inter = "-" if t.intermediate_ms is None else f"{t.intermediate_ms / 1000:.1f} s"
    out.print(f"sent-but-unrecorded window: {windows}; time in an intermediate state: {inter}")


@click.command()
@source_options
@click.option("--older-than", default="10m", show_default=True, help="how long counts as stuck")
@click.option("--json", "as_json", is_flag=True, help="JSON lines output")
@click.option(
    "--webhook",
    default=None,
    envvar="EFFECTS_WEBHOOK",
    help="POST the finding here when something is stuck (env EFFECTS_WEBHOOK: keeps a secret URL out of ps)",
)
@click.option(
    "--webhook-format",
    type=click.Choice(["slack", "pagerduty", "json"]),
    default="json",
    show_default=True,
    help="the body: Slack incoming webhook, PagerDuty Events v2 trigger, or the rows as JSON",
)
@click.option(
    "--routing-key", envvar="EFFECTS_PAGERDUTY_ROUTING_KEY", default=None, help="PagerDuty Events v2 routing key"
)
@click.option(
    "--webhook-timeout",
    type=click.FloatRange(min=0, min_open=True, max=300),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="the whole post, redirects included (at most 300)",
)
def stuck(
    db: str | None,
    bootstrap: str | None,
    prefix: str | None,
    older_than: str,
    as_json: bool,
    webhook: str | None,
    webhook_format: str,
    routing_key: str | None,
    webhook_timeout: float,
) -> None:
    """Effects sitting in an intermediate state (PENDING, EXECUTED, UNCERTAIN, ESCALATED) longer
    than --older-than. Exits 3 when there are any (for cron jobs and CI checks), 0 when none.
    With --webhook, a finding is also posted (Slack, PagerDuty Events v2 or plain JSON); a post
    that fails is one line on stderr and exit 4."""
    from effect_ledger.processors.ops import page
    from effect_ledger.processors.ops.views import stuck as find_stuck

    with user_errors():
        if webhook is not None:
            page.check_url(webhook)
            if webhook_format == "pagerduty" and not routing_key:
                raise ValueError("--webhook-format pagerduty needs --routing-key (or EFFECTS_PAGERDUTY_ROUTING_KEY)")
        cfg = None if db is not None else kafka_of(bootstrap, prefix)
        rows = find_stuck(duration_ms(older_than), db=db, cfg=cfg)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r.__dict__))
    else:
        if rows:
            table = Table(title=f"{len(rows)} effects stuck for longer than {older_than}", title_justify="left")
            for col in ("effect", "state", "target", "operation", "attempt", "since (UTC)", "reason"):
                table.add_column(col)
            for r in rows:
                table.add_row(
                    r.effect_id, r.state, r.target, r.operation, str(r.attempt), iso(r.created_ms), r.reason or ""
                )
            out.print(table)
        else:
            out.print(f"no effect stuck for longer than {older_than}")
    if rows and webhook is not None:
        try:
            page.post(webhook, page.payload(rows, webhook_format, older_than, routing_key), webhook_timeout)
        except page.PageError as e:
            click.echo(f"effects: webhook not delivered: {e}", err=True)
            sys.exit(EXIT_PAGE_FAILED)
    sys.exit(EXIT_FOUND if rows else 0)


@click.command()
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, help="Kafka bootstrap servers")
@click.option("--prefix", envvar="EFFECTS_TOPIC_PREFIX", default=None, help="topic name prefix")
@click.option("--state", "states", multiple=True, help="only these states; repeatable")
@click.option("--target", "targets", multiple=True, help="only these targets; repeatable")
@click.option("--json", "as_json", is_flag=True, help="JSON lines output")
@click.option("--from-beginning", is_flag=True, help="start at the oldest retained state, not the newest")
@click.option("--count", type=click.IntRange(min=0), default=None, help="exit after this many matching records")
@click.option(
    "--give-up-after",
    type=POSITIVE_SECONDS,
    default=None,
    metavar="SECONDS",
    help="exit 1 when no broker has answered for this long, at the start or later [30, or --broker-timeout]",
)
def tail(
    bootstrap: str | None,
    prefix: str | None,
    states: tuple[str, ...],
    targets: tuple[str, ...],
    as_json: bool,
    from_beginning: bool,
    count: int | None,
    give_up_after: float | None,
) -> None:
    """Follow effects.state: one line per state change, filterable by state and target. A broker
    that is gone for longer than --give-up-after is one line on stderr and exit 1."""
    from effect_ledger.processors.ops.sources import follow_topic
    from effect_ledger.streams.codec import DecodeError
    from effect_ledger.streams.model import State
    from effect_ledger.streams.schema_topic import kafka_codec

    with user_errors():
        for s in states:
            if s.upper() not in State.__members__:
                raise ValueError(f"--state {s!r}: one of {', '.join(State.__members__)}")
        cfg = kafka_config(bootstrap, prefix)
    wanted = {s.upper() for s in states}
    codec = kafka_codec(cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    give_up = give_up_after if give_up_after is not None else broker_wait(30.0)
    if count == 0:
        return
    seen = 0
    try:
        # A broker gone for longer than give_up raises SourceError: the command line's one line, exit 1.
        for value in follow_topic(cfg, cfg.topics.state, give_up_s=give_up, from_beginning=from_beginning, stop=stop):
            try:
                st = codec.decode(value)
            except DecodeError:
                continue
            if (wanted and st.state.value not in wanted) or (targets and st.target not in targets):
                continue
            seen += 1
            if as_json:
                d = {f: getattr(st, f) for f in st.__dataclass_fields__}
                d["flags"], d["receipt_ids"] = list(st.flags), list(st.receipt_ids)
                click.echo(json.dumps(d, default=str))
            else:
                click.echo(
                    f"{iso(st.updated_ms)} {st.state.value:<11} {st.target:<12} {st.effect_id} "
                    f"v{st.version}{' ' + st.reason if st.reason else ''}"
                )
            if count is not None and seen >= count:
                break
    except KeyboardInterrupt:
        pass


@click.command()
@source_options
@click.option("--json", "as_json", is_flag=True, help="JSON lines output")
def escalations(db: str | None, bootstrap: str | None, prefix: str | None, as_json: bool) -> None:
    """The escalation queue: ESCALATED effects with their evidence (attempts, reconciler answers).
    Decide with `effects resolve`."""
    from effect_ledger.processors.ops.views import escalations as find

    with user_errors():
        cfg = None if db is not None else kafka_of(bootstrap, prefix)
        items = find(db=db, cfg=cfg)
    if as_json:
        for it in items:
            click.echo(json.dumps({**it.row.__dict__, "attempts": it.attempts, "answers": it.answers}))
        return
    if not items:
        out.print("the escalation queue is empty")
        return
    table = Table(title=f"{len(items)} escalated effects", title_justify="left")
    for col in ("effect", "target", "operation", "attempts", "since (UTC)", "why", "reconciler answers"):
        table.add_column(col)
    for it in items:
        r = it.row
        table.add_row(
            r.effect_id,
            r.target,
            r.operation,
            str(it.attempts),
            iso(r.created_ms),
            r.reason or "",
            "\n".join(it.answers) or "-",
        )
    out.print(table)


@click.command()
@click.argument("key")
@source_options
@click.option("--confirmed", "verdict", flag_value="CONFIRMED", help="it happened (give --receipt)")
@click.option(
    "--absent",
    "verdict",
    flag_value="ABSENT",
    help="it never happened: the agent may execute it (refused while the attempt may still land)",
)
@click.option("--abandon", "verdict", flag_value="ABANDONED", help="close it; the agent will refuse it")
@click.option("--compensated", "verdict", flag_value="COMPENSATED", help="it was undone by a compensating effect")
@click.option("--receipt", default=None, help="the destination's id for the effect (with --confirmed)")
@click.option("--by", required=True, help="who decides")
@click.option("--reason", required=True, help="why")
def resolve(
    key: str,
    db: str | None,
    bootstrap: str | None,
    prefix: str | None,
    verdict: str | None,
    receipt: str | None,
    by: str,
    reason: str,
) -> None:
    """Record a person's decision on an effect; the SDK honours it on its next attempt. In Kafka mode
    it is written to effects.decisions (restrict who may write it with Kafka ACLs) with your
    identity (the SASL user, else the OS user) beside --by. --absent is refused while the attempt
    may still land at the destination (PENDING/EXECUTED, or before its deadline + 2 s)."""
    import asyncio

    from effect_ledger.streams.model import DecisionKind

    if verdict is None:
        fail("say what happened: --confirmed --receipt ID, --absent, --abandon or --compensated")
    if verdict == "CONFIRMED" and not receipt:
        fail("--confirmed needs --receipt ID (the destination's id for the effect)")
    kind = DecisionKind(str(verdict))
    with user_errors():
        if db is not None:
            from effect_ledger.processors.ops.views import read_only
            from effect_ledger.streams.ledger import Ledger

            read_only(db).close()  # refuses a missing file or one that is not a ledger, without writing to it

            async def go() -> str:
                async with await Ledger.open(db) as ledger:
                    if await ledger.get(key) is None:
                        raise SourceError(f"no effect with key {key!r} in {db}")
                    effect = await ledger.decide(key, kind, by=by, reason=reason, receipt_id=receipt)
                    return effect.state.value

            state = asyncio.run(go())
            click.echo(f"{key}: decision {kind.value} recorded by {by}; state {state}")
        else:
            from effect_ledger.processors.ops.views import decide

            cfg = kafka_of(bootstrap, prefix)
            d = decide(key, kind, by, reason, receipt, cfg=cfg)
            click.echo(
                f"{key}: decision {kind.value} (attempt {d.attempt}) written to {cfg.topics.decisions} "
                f"by {by} ({d.principal})"
            )


@click.command()
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, help="Kafka bootstrap servers")
@click.option("--prefix", envvar="EFFECTS_TOPIC_PREFIX", default=None, help="topic name prefix")
@click.option(
    "--to", "url", required=True, help="sqlite:///PATH or postgresql://[USER@]HOST[:PORT]/DB (the [postgres] extra)"
)
@click.option("--once", is_flag=True, help="catch up to the current end of effects.state, then exit")
@click.option(
    "--batch", type=click.IntRange(min=1), default=5000, show_default=True, help="records per transaction, at most"
)
def sink(bootstrap: str | None, prefix: str | None, url: str, once: bool, batch: int) -> None:
    """Materialise effects.state into a SQL table `effects` (indexed by state and update time) in
    SQLite or PostgreSQL, with the consumed offsets in the same transaction: a restart neither
    loses nor doubles a row."""
    from effect_ledger.processors.ops.sink import StateSink

    with user_errors():
        cfg = kafka_of(bootstrap, prefix)
        s = StateSink(cfg, url, batch=batch)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with user_errors():
            stats = s.run(once=once, stop=stop)
    except KeyboardInterrupt:
        stats = s.stats
    finally:
        s.close()
    click.echo(f"sink: {stats.records:,} state records in {stats.batches} batches -> {s.describe}")
