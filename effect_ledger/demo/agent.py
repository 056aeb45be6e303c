"""The agent of the refund story: one workflow step that refunds an order at the gateway.

Run as a child process so it can be killed for real (``EFFECT_LEDGER_CRASH=<point>``):

    python -m effect_ledger.demo.agent --mode ledger --workdir DIR --gateway URL --kind key+lookup

``--mode naive`` is how such steps are usually written: a checkpoint after the call and a fresh
idempotency key per attempt; a crash between the two pays twice. ``--mode ledger`` wraps the call
in ``Ledger.execute``; ``--mode ledger-sync`` in ``SyncLedger.execute``, the path of synchronous
code and of the LangGraph, DBOS, CrewAI and Agent Framework adapters; ``--mode ledger-sync-inline``
the same with ``inline_calls=True`` (the call in the caller's thread). Prints one JSON line; exit
code 0 confirmed, 3 uncertain/escalated, 4 rejected, 5 still in progress after ``--patience``
seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from effect_ledger.core.reconcile import Target
from effect_ledger.demo.client import GatewayClient, RefundRejected
from effect_ledger.demo.gateway import KINDS
from effect_ledger.errors import EffectInProgress, EffectUncertain, LedgerUnavailable
from effect_ledger.sdk import crashpoints
from effect_ledger.sdk.ledger import DEFAULT_CONFIRM_WITHIN_S, Confirmation, Ledger
from effect_ledger.sdk.sync import SyncLedger
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.targets.load import parse_targets

EXIT_OK, EXIT_UNCERTAIN, EXIT_REJECTED, EXIT_IN_PROGRESS = 0, 3, 4, 5


def payments_declaration(gateway_url: str, kind: str) -> str:
    """The targets file of the demo: what effect-ledger is told about the gateway (can it be asked
    by key, does it deduplicate keys, which error means "rejected"). The agent, the runner and the
    reconcilers all read this one declaration."""
    lookup = f"{gateway_url}/refunds/by-key/{{key}}" if kind in ("key+lookup", "lookup") else "none"
    honours = "true" if kind in ("key+lookup", "key") else "false"
    return (
        "[targets.payments]\n"
        f'lookup = "{lookup}"\n'
        f"honours_keys = {honours}\n"
        'key_retention = "24h"\n'
        'definite_errors = ["effect_ledger.demo.client:RefundRejected"]\n'
    )


def write_declaration(path: Path, gateway_url: str, kind: str) -> Path:
    path.write_text(payments_declaration(gateway_url, kind))
    return path


def payments_target(gateway_url: str, kind: str) -> Target:
    """The ``payments`` target as the declaration above defines it."""
    return parse_targets(payments_declaration(gateway_url, kind), f"payments ({kind})")[0]


def _confirmed(c: Confirmation) -> dict[str, Any]:
    return {"result": "confirmed", "key": c.effect_id, "receipt_id": c.receipt_id, "called": c.called,
            "source": c.source.value}  # fmt: skip


async def run_ledger(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    db = Path(args.workdir) / "effects.db"
    kafka = KafkaConfig.from_env(bootstrap=args.kafka, prefix=args.prefix) if args.kafka else None
    # Kafka mode: the intent must be on Kafka before the call (sync), so that a restart on another
    # host, with an empty disk, finds it through the processor (lookup).
    async with await Ledger.open(
        str(db),
        targets=args.targets or [payments_target(args.gateway, args.kind)],
        kafka=kafka,
        sync=kafka is not None,
        confirm_within=args.confirm_within,
        lookup=args.lookup,
    ) as ledger:
        async with GatewayClient(args.gateway) as gw:
            loop = asyncio.get_running_loop()
            give_up = loop.time() + args.patience
            while True:
                try:
                    c = await ledger.execute(
                        target="payments",
                        operation="refund.create",
                        run_id=args.run_id,
                        step=f"refund-order-{args.order}",
                        request={"order": args.order, "amount": args.amount, "currency": "CNY"},
                        call=lambda key: gw.refund(args.order, args.amount, idempotency_key=key),
                        timeout=args.timeout,
                    )
                    return EXIT_OK, _confirmed(c)
                except EffectInProgress as e:
                    # An earlier attempt may still land until its deadline: wait it out, then ask again.
                    if loop.time() >= give_up:
                        return EXIT_IN_PROGRESS, {"result": "in_progress", "reason": str(e)}
                    await asyncio.sleep(min(1.0, max(0.05, (e.retry_after_ms or 200) / 1000)))
                except LedgerUnavailable as e:
                    # Kafka or the processor cannot vouch for the key yet: hold, ask again shortly.
                    if loop.time() >= give_up:
                        return EXIT_IN_PROGRESS, {"result": "unavailable", "reason": str(e)}
                    await asyncio.sleep(0.2)
                except EffectUncertain as e:
                    return EXIT_UNCERTAIN, {
                        "result": "uncertain",
                        "key": e.effect_id,
                        "state": e.state,
                        "reason": e.reason,
                    }
                except RefundRejected as e:
                    return EXIT_REJECTED, {"result": "rejected", "reason": str(e)}


async def _refund(url: str, order: str, amount: int, key: str) -> dict[str, Any]:
    async with GatewayClient(url) as gw:
        return await gw.refund(order, amount, idempotency_key=key)


def run_ledger_sync(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """``run_ledger`` through ``SyncLedger``, embedded: the same step written as synchronous code."""
    db = Path(args.workdir) / "effects.db"
    with SyncLedger.open(
        str(db),
        targets=args.targets or [payments_target(args.gateway, args.kind)],
        inline_calls=args.mode == "ledger-sync-inline",
    ) as ledger:
        give_up = time.monotonic() + args.patience
        while True:
            try:
                c = ledger.execute(
                    target="payments",
                    operation="refund.create",
                    run_id=args.run_id,
                    step=f"refund-order-{args.order}",
                    request={"order": args.order, "amount": args.amount, "currency": "CNY"},
                    # The client is async: the call's thread runs the coroutine to its end.
                    call=lambda key: _refund(args.gateway, args.order, args.amount, key),
                    timeout=args.timeout,
                )
                return EXIT_OK, _confirmed(c)
            except EffectInProgress as e:
                if time.monotonic() >= give_up:
                    return EXIT_IN_PROGRESS, {"result": "in_progress", "reason": str(e)}
                time.sleep(min(1.0, max(0.05, (e.retry_after_ms or 200) / 1000)))
            except EffectUncertain as e:
                return EXIT_UNCERTAIN, {"result": "uncertain", "key": e.effect_id, "state": e.state, "reason": e.reason}
            except RefundRejected as e:
                return EXIT_REJECTED, {"result": "rejected", "reason": str(e)}


async def run_naive(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    checkpoint = Path(args.workdir) / "naive-checkpoint.json"
    done = json.loads(checkpoint.read_text()) if checkpoint.exists() else {}
    step = f"refund-order-{args.order}"
    if step in done:
        return EXIT_OK, {"result": "confirmed", "receipt_id": done[step], "called": False}
    crashpoints.reached(crashpoints.BEFORE_INTENT)
    crashpoints.reached(crashpoints.AFTER_INTENT)
    async with GatewayClient(args.gateway) as gw:
        refund = await gw.refund(args.order, args.amount, idempotency_key=uuid.uuid4().hex)
    crashpoints.reached(crashpoints.AFTER_CALL)
    crashpoints.reached(crashpoints.AFTER_EXECUTED)
    done[step] = refund["id"]
    checkpoint.write_text(json.dumps(done))
    return EXIT_OK, {"result": "confirmed", "receipt_id": refund["id"], "called": True}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m effect_ledger.demo.agent")
    p.add_argument("--mode", choices=("ledger", "ledger-sync", "ledger-sync-inline", "naive"), required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--gateway", required=True)
    p.add_argument("--kind", choices=KINDS, default="key+lookup")
    p.add_argument("--targets", default=None, help="the targets file (default: the gateway's, for --kind)")
    p.add_argument("--order", default="123")
    p.add_argument("--amount", type=int, default=4800)
    p.add_argument("--run-id", default="run-1")
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument(
        "--confirm-within", type=float, default=DEFAULT_CONFIRM_WITHIN_S,
        help="Kafka mode: seconds an intent may wait for the broker and the processor, on top of --timeout",
    )  # fmt: skip
    p.add_argument("--patience", type=float, default=30.0)
    p.add_argument("--kafka", default=None, help="Kafka mode: bootstrap servers")
    p.add_argument("--prefix", default=None, help="Kafka mode: topic prefix")
    p.add_argument("--lookup", default=None, help="Kafka mode: the processor workers' URLs, comma-separated")
    args = p.parse_args(argv)
    if args.mode in ("ledger-sync", "ledger-sync-inline"):
        if args.kafka:
            p.error(f"--mode {args.mode} runs embedded (no --kafka)")
        code, out = run_ledger_sync(args)
    else:
        code, out = asyncio.run(run_ledger(args) if args.mode == "ledger" else run_naive(args))
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
