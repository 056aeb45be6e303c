"""``effects audit | trace | stuck | tail | escalations | resolve | sink``: the operator and
auditor commands. Each reads an embedded ledger (``--db FILE``) or the Kafka topics (the Kafka
options), calls ``effect_ledger.ops`` and prints a table, or JSON/CSV for machines."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from effect_ledger.cli import _render as render
from effect_ledger.cli._boundary import POSITIVE_SECONDS, Seconds, broker_wait
from effect_ledger.cli._shared import (
    err,
    fail,
    json_lines_option,
    json_option,
    kafka_config,
    kafka_options,
    ready,
    service_log_options,
    source_options,
    start_logging,
    wide_option,
)
from effect_ledger.core.timeparse import TimeSpecError, duration_ms, iso, time_ms
from effect_ledger.ops.sources import SourceError
from effect_ledger.streams.config import KafkaConfig

EXIT_FOUND = 3  # `stuck` found effects: page someone
EXIT_PAGE_FAILED = 4  # `stuck --webhook` found effects and the page was not delivered


def kafka_of(bootstrap: str | None, prefix: str | None) -> KafkaConfig:
    """The operator commands' Kafka settings once a broker answers (5 s, or --broker-timeout). A
    replay that loses its broker midway gives up after the same bound (30 s by default)."""
    from effect_ledger.ops.sources import set_give_up

    set_give_up(broker_wait(30.0))
    return ready(kafka_config(bootstrap, prefix), 5)


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
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="CSV output")
@wide_option
@click.option("--stuck-after", default="10m", show_default=True, help="what counts as stuck")
@click.option("--fail-on-check", is_flag=True, help="exit 3 when a check fails, on a terminal too")
@click.option(
    "--report-only",
    is_flag=True,
    help="exit 0 whatever the checks say (without it, a failed check exits 1 when stdout is not a terminal)",
)
@click.option(
    "--console-url",
    envvar="EFFECTS_CONSOLE_URL",
    show_envvar=True,
    default=None,
    help="the console's address, to print a link per failing key [the /effect/KEY path alone]",
)
@click.option(
    "--spill-dir",
    type=click.Path(file_okay=False, exists=True),
    envvar="EFFECTS_AUDIT_SPILL_DIR",
    default=None,
    help="where a large window is grouped on disk (about 80 bytes an event, removed afterwards) [TMPDIR]",
)
def audit(
    db: str | None,
    bootstrap: str | None,
    prefix: str | None,
    from_: str,
    to: str,
    as_json: bool,
    as_csv: bool,
    wide: bool,
    stuck_after: str,
    fail_on_check: bool,
    report_only: bool,
    console_url: str | None,
    spill_dir: str | None,
) -> None:
    """Replay effects.events for a window, fold it fresh, and check it: keyed writes, recorded
    outcomes, receipts, uncertain, resolved by reconciliation, duplicates, stuck, and the
    sent-but-unrecorded window (p50/p99/max), overall and per target. A failed check names its
    effects (the first 10 here, 1,000 in --json, and how many in all), each with its console link.
    Memory stays bounded whatever the window: past 250,000 events the replay is grouped on disk.

    Exit status: 1 when a check fails and stdout is not a terminal (cron, CI, a pipe), unless
    --report-only; 3 with --fail-on-check; otherwise 0."""
    from effect_ledger.ops.audit import audit as run_audit
    from effect_ledger.ops.audit import console_base, effect_link
    from effect_ledger.ops.sources import db_events, replay_events
    from effect_ledger.ops.views import now_ms

    # Checked before the replay (a mistake is told at once), and without user:password@ from here on.
    console_url = console_base(console_url) if console_url else None
    now = now_ms()
    start, end = time_ms(from_, now), time_ms(to, now)
    if start >= end:
        raise TimeSpecError(f"empty window: --from {iso(start)} is not before --to {iso(end)}")
    stuck_ms = duration_ms(stuck_after)
    # SIGTERM ends the command like Ctrl-C, through its finally blocks: a spill folder is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with progress_bar("replaying effects.events") as progress:
        if db is not None:
            records = db_events(db, start, end, build=False)
        else:
            records = replay_events(kafka_of(bootstrap, prefix), start, progress, end, build=False)
        report = run_audit(records, start, end, now, stuck_ms, spill_dir=spill_dir)
    link = lambda key: effect_link(console_url, key)  # noqa: E731
    if as_json:
        click.echo(report.to_json(link))
    elif as_csv:
        click.echo(report.to_csv(), nl=False)
    else:
        render.audit_report(report, wide, link)
    if report.passed or report_only:
        return
    if fail_on_check:
        sys.exit(EXIT_FOUND)
    # A person at a terminal reads the FAIL rows; a cron job, CI or a pipe has only the status to go on.
    if not sys.stdout.isatty():
        sys.exit(1)


@click.command()
@click.argument("key")
@source_options
@click.option(
    "--since",
    default=None,
    help="Kafka: read the key's records from this time on (ISO time, epoch ms, -2d) [back from now in "
    "steps of 1 h, 1 d, 7 d, 31 d until its first intent is found, then from the start]",
)
@json_option
@wide_option
def trace(
    key: str, db: str | None, bootstrap: str | None, prefix: str | None, since: str | None, as_json: bool, wide: bool
) -> None:
    """The timeline of one effect: every event with its time and source, the windows, the state.
    On Kafka only the key's partition is read, from where its first intent lies (time index)."""
    from effect_ledger.ops.views import now_ms
    from effect_ledger.ops.views import trace as run_trace

    since_ms = None if since is None else time_ms(since, now_ms())
    cfg = None if db is not None else kafka_of(bootstrap, prefix)
    t = run_trace(key, db=db, cfg=cfg, since_ms=since_ms)
    if t.effect is None:
        after = f" since {iso(since_ms)}" if since_ms is not None else ""
        raise SourceError(f"no effect with key {key!r}{after}")
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
                            "at_ms": ln.at_ms,  # the log's time
                            "claimed_at_ms": ln.claimed_ms,  # the writer's clock
                            "skew_ms": ln.skew_ms,
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
    render.trace(t, wide)


@click.command()
@source_options
@click.option("--older-than", default="10m", show_default=True, help="how long counts as stuck")
@json_lines_option
@wide_option
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
    type=Seconds(min=0, min_open=True, max=300),
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
    wide: bool,
    webhook: str | None,
    webhook_format: str,
    routing_key: str | None,
    webhook_timeout: float,
) -> None:
    """Effects sitting in an intermediate state (PENDING, EXECUTED, UNCERTAIN, ESCALATED) longer
    than --older-than. Exits 3 when there are any (for cron jobs and CI checks), 0 when none.
    With --webhook, a finding is also posted (Slack, PagerDuty Events v2 or plain JSON); a post
    that fails is one line on stderr and exit 4."""
    from effect_ledger.ops import page
    from effect_ledger.ops.views import stuck as find_stuck

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
        render.stuck_rows(rows, older_than, wide)
    if rows and webhook is not None:
        try:
            page.post(webhook, page.payload(rows, webhook_format, older_than, routing_key), webhook_timeout)
        except page.PageError as e:
            click.echo(f"effects: webhook not delivered: {e}", err=True)
            sys.exit(EXIT_PAGE_FAILED)
    sys.exit(EXIT_FOUND if rows else 0)


@click.command()
@kafka_options
@click.option("--state", "states", multiple=True, help="only these states; repeatable")
@click.option("--target", "targets", multiple=True, help="only these targets; repeatable")
@json_lines_option
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
    from effect_ledger.ops.follow import follow_states, parse_states

    wanted = parse_states(states)
    cfg = kafka_config(bootstrap, prefix)
    if count == 0:
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    give_up = give_up_after if give_up_after is not None else broker_wait(30.0)
    seen = 0
    try:
        # A broker gone for longer than give_up raises SourceError: the command line's one line, exit 1.
        for st in follow_states(
            cfg, states=wanted, targets=set(targets), give_up_s=give_up, from_beginning=from_beginning, stop=stop
        ):
            seen += 1
            if as_json:
                d = {f: getattr(st, f) for f in st.__dataclass_fields__}
                d["flags"], d["receipt_ids"] = list(st.flags), list(st.receipt_ids)
                click.echo(json.dumps(d, default=str))
            else:
                click.echo(render.state_line(st))
            if count is not None and seen >= count:
                break
    except KeyboardInterrupt:
        pass


@click.command()
@source_options
@json_lines_option
@wide_option
def escalations(db: str | None, bootstrap: str | None, prefix: str | None, as_json: bool, wide: bool) -> None:
    """The escalation queue: ESCALATED effects with their evidence (attempts, reconciler answers).
    Decide with `effects resolve`."""
    from effect_ledger.ops.views import escalations as find

    cfg = None if db is not None else kafka_of(bootstrap, prefix)
    items = find(db=db, cfg=cfg)
    if as_json:
        for it in items:
            click.echo(json.dumps({**it.row.__dict__, "attempts": it.attempts, "answers": it.answers}))
        return
    render.escalations(items, wide)


@click.command()
@click.argument("key")
@source_options
@click.option("--confirmed", is_flag=True, help="it happened (give --receipt)")
@click.option(
    "--absent",
    is_flag=True,
    help="it never happened: the agent may execute it (refused while the attempt may still land)",
)
@click.option("--abandon", is_flag=True, help="close it; the agent will refuse it")
@click.option("--compensated", is_flag=True, help="it was undone by a compensating effect")
@click.option("--receipt", default=None, help="the destination's id for the effect (with --confirmed)")
@click.option("--by", required=True, help="who decides")
@click.option("--reason", required=True, help="why")
@click.option(
    "--targets",
    "targets_spec",
    metavar="FILE",
    envvar="EFFECTS_TARGETS",
    default=None,
    help="the targets declaration: its lands_within says how long --absent is refused after the deadline "
    "(2 s without it) [env EFFECTS_TARGETS]",
)
def resolve(
    key: str,
    db: str | None,
    bootstrap: str | None,
    prefix: str | None,
    confirmed: bool,
    absent: bool,
    abandon: bool,
    compensated: bool,
    receipt: str | None,
    by: str,
    reason: str,
    targets_spec: str | None,
) -> None:
    """Record a person's decision on an effect; the SDK honours it on its next attempt. In Kafka mode
    it is written to effects.decisions (restrict who may write it with Kafka ACLs) with your
    identity (the SASL user, else the OS user) beside --by. --absent is refused while the attempt
    may still land at the destination (PENDING/EXECUTED, or before its deadline + the target's
    lands_within, 2 s unless --targets declares another)."""
    from effect_ledger.core.model import DecisionKind

    # Each decision is a flag of its own: given together, none of them is taken (not the last one).
    given = {
        "--confirmed": (confirmed, "CONFIRMED"),
        "--absent": (absent, "ABSENT"),
        "--abandon": (abandon, "ABANDONED"),
        "--compensated": (compensated, "COMPENSATED"),
    }
    chosen = [(flag, kind) for flag, (on, kind) in given.items() if on]
    if not chosen:
        fail("say what happened: --confirmed --receipt ID, --absent, --abandon or --compensated")
    if len(chosen) > 1:
        both = " and ".join(f for f, _ in chosen)
        raise click.UsageError(f"one decision at a time: {both} given together", ctx=click.get_current_context())
    verdict = chosen[0][1]
    if verdict == "CONFIRMED" and not receipt:
        fail("--confirmed needs --receipt ID (the destination's id for the effect)")
    kind = DecisionKind(str(verdict))
    if db is not None:
        from effect_ledger.ops.resolve import decide_in_file

        state = decide_in_file(db, key, kind, by, reason, receipt, targets=targets_spec)
        click.echo(f"{key}: decision {kind.value} recorded by {by}; state {state.value}")
    else:
        from effect_ledger.ops.views import decide

        cfg = kafka_of(bootstrap, prefix)
        from effect_ledger.targets.load import load_targets

        declared = {t.name: t for t in load_targets(targets_spec)} if targets_spec else None
        d = decide(key, kind, by, reason, receipt, cfg=cfg, targets=declared)
        click.echo(
            f"{key}: decision {kind.value} (attempt {d.attempt}) written to {cfg.topics.decisions} "
            f"by {by} ({d.principal})"
        )


@click.command()
@kafka_options
@click.option(
    "--to", "url", required=True, help="sqlite:///PATH or postgresql://[USER@]HOST[:PORT]/DB (the [postgres] extra)"
)
@click.option("--once", is_flag=True, help="catch up to the current end of effects.state, then exit")
@click.option(
    "--batch", type=click.IntRange(min=1), default=5000, show_default=True, help="records per transaction, at most"
)
@service_log_options
def sink(
    bootstrap: str | None, prefix: str | None, url: str, once: bool, batch: int, log_format: str, log_summary: float
) -> None:
    """Materialise effects.state into a SQL table `effects` (indexed by state and update time) in
    SQLite or PostgreSQL, with the consumed offsets in the same transaction: a restart neither
    loses nor doubles a row."""
    from effect_ledger.ops.sink import StateSink
    from effect_ledger.streams import rights

    start_logging("sink", log_format)
    cfg = kafka_of(bootstrap, prefix)
    rights.require(cfg, "sink", "effects sink")
    s = StateSink(cfg, url, batch=batch, summary_s=log_summary)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stats = s.run(once=once, stop=stop)
    except KeyboardInterrupt:
        stats = s.stats
    finally:
        s.close()
    click.echo(f"sink: {stats.records:,} state records in {stats.batches} batches -> {s.describe}")
