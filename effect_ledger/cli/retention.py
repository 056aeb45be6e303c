"""``effects retire`` and ``effects erase``: retiring closed effects and erasing a subject's request
bodies (``effect_ledger.core.retention``, ``effect_ledger.sdk.erasure``). Errors: one line on
stderr, exit 1."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import click

from effect_ledger.cli._boundary import LedgerPath
from effect_ledger.cli.ops import fail, kafka_of, source_options


def register(main: click.Group) -> None:
    main.add_command(retire)
    main.add_command(erase)


@click.command()
@source_options
@click.option("--older-than", required=True, help="retention: closed for at least this long (e.g. 30d)")
@click.option("--embedded", is_flag=True, help="--db is an embedded ledger (no relay): retire its events anyway")
@click.option("--allow-short", is_flag=True, help="accept a retention under 1 day (tests, demos)")
@click.option("--dry-run", is_flag=True, help="Kafka: list what is due, write nothing")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
def retire(
    db: str | None,
    bootstrap: str | None,
    prefix: str | None,
    older_than: str,
    embedded: bool,
    allow_short: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Retire closed effects (CONFIRMED, FAILED, ABSENT, ABANDONED, COMPENSATED) unchanged for
    --older-than: their events are deleted (an embedded file) or no longer kept by the processor,
    their state is tombstoned, and their key is never executed again (EffectRetired)."""
    from effect_ledger.core.retention import MIN_RETENTION_MS
    from effect_ledger.core.timeparse import duration_ms
    from effect_ledger.streams.config import operator_identity

    after_ms = duration_ms(older_than)
    if after_ms <= 0:
        raise ValueError(f"--older-than {older_than}: give a retention longer than zero")
    if after_ms < MIN_RETENTION_MS and not allow_short:
        raise ValueError(
            f"--older-than {older_than} is under 1 day: late receipts and retries may still come for "
            "those keys (give --allow-short to do it anyway)"
        )
    now = int(time.time() * 1000)
    if db is not None:
        keys = asyncio.run(_retire_file(db, now, after_ms, embedded))
        where = db
    else:
        from effect_ledger.ops.retire import sweep

        cfg = kafka_of(bootstrap, prefix)
        keys = [s.effect_id for s in sweep(cfg, after_ms, operator_identity(cfg), now_ms=now, dry_run=dry_run)]
        where = cfg.topics.events
    if as_json:
        click.echo(json.dumps({"retired" if db or not dry_run else "due": keys, "count": len(keys)}))
    elif db is not None:
        click.echo(f"retired {len(keys)} effect{'s' if len(keys) != 1 else ''} in {where}")
    elif dry_run:
        click.echo(f"{len(keys)} effect{'s' if len(keys) != 1 else ''} due for retirement")
    else:
        click.echo(f"asked the processor to retire {len(keys)} effect{'s' if len(keys) != 1 else ''} (via {where})")


async def _retire_file(db: str, now: int, after_ms: int, embedded: bool) -> list[str]:
    from effect_ledger.sdk.store import retire as retire_store
    from effect_ledger.sdk.store.sqlite import Store

    if not Path(db).exists():
        raise ValueError(f"no ledger file at {db}")
    store = await Store.open(db)
    try:
        relayed = await retire_store.has_relayed(store)
        if not relayed and not embedded:
            has_events = bool(await store.query("SELECT 1 AS x FROM events LIMIT 1"))
            if has_events:
                raise ValueError(
                    f"{db} has never relayed an event to Kafka: if it is an embedded ledger, give --embedded; "
                    "if it is a Kafka outbox, run its relay first"
                )
        done = await retire_store.retire(store, now, after_ms, require_sent=relayed or not embedded)
        return [m.effect_id for m in done]
    finally:
        await store.close()


@click.command()
@click.option(
    "--db", "dbs", multiple=True, type=LedgerPath(exists=True),
    help="embedded ledger files holding keys (repeatable); without it, the effects.keys topic on Kafka",
)  # fmt: skip
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, help="Kafka bootstrap servers [127.0.0.1:9092]")
@click.option("--prefix", envvar="EFFECTS_TOPIC_PREFIX", default=None, help="topic name prefix")
@click.option("--subject", required=True, help="the subject whose request bodies become unreadable")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
def erase(dbs: tuple[str, ...], bootstrap: str | None, prefix: str | None, subject: str, as_json: bool) -> None:
    """Erase one subject's request bodies (targets with body = "encrypt"): its keys are deleted, so
    every body sealed under them is unreadable, wherever it was copied (the ledger files,
    effects.events). States, times, receipt ids and request digests stay: the audit still holds."""
    if not subject.strip():
        fail("--subject: give the subject's id (the value the target's subject field holds)")
    if dbs:
        n = asyncio.run(_erase(dbs, subject))
        where = dbs[0] if len(dbs) == 1 else f"{len(dbs)} files"
    else:
        from effect_ledger.sdk.kafka.keyring import KafkaKeyring

        cfg = kafka_of(bootstrap, prefix)
        n = asyncio.run(KafkaKeyring(cfg).erase(subject))
        where = cfg.topics.keys
    if as_json:
        click.echo(json.dumps({"subject_keys_erased": n}))
    else:
        click.echo(f"erased {n} key{'s' if n != 1 else ''} of the subject in {where}")


async def _erase(dbs: tuple[str, ...], subject: str) -> int:
    from effect_ledger.sdk import erasure
    from effect_ledger.sdk.store.sqlite import Store

    total = 0
    for db in dbs:
        store = await Store.open(db)
        try:
            total += await erasure.erase(store, subject)
        finally:
            await store.close()
    return total
