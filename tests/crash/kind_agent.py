"""An agent that makes one payment (``--kind payment``) or opens one ticket (``--kind ticket``)
through ``Ledger.execute``, against the loopback fakes of ``effect_ledger.demo.payment_api`` and
``ticket_api``, declared with the built-in target kinds. Run as a child process so that it can be
SIGKILLed at a crash point (``EFFECT_LEDGER_CRASH``):

    python -m tests.crash.kind_agent --kind payment --api URL --workdir DIR --run-id R

Prints one JSON line; exit 0 confirmed, 3 uncertain/escalated, 4 rejected, 5 still in progress
after ``--patience`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from effect_ledger.errors import EffectInProgress, EffectUncertain, LedgerUnavailable
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.targets import payment

EXIT_OK, EXIT_UNCERTAIN, EXIT_REJECTED, EXIT_IN_PROGRESS = 0, 3, 4, 5
TARGET = {"payment": "payments", "ticket": "tickets"}
OPERATION = {"payment": "payment_intent.create", "ticket": "issue.create"}


class Rejected(Exception):
    """The destination refused the request (a 4xx): nothing happened."""


def declaration(kind: str, api: str, search_lag: str, backoff: str = "") -> str:
    """The targets file: a few lines per kind, as a user writes them."""
    if kind == "payment":
        body = f'kind = "payment"\napi = "{api}"\nsearch_lag = "{search_lag}"\n'
    else:
        body = f'kind = "ticket"\napi = "{api}"\nkey_field = "customfield_10050"\nproject = "OPS"\n'
        body += f'search_lag = "{search_lag}"\n'
    body += 'definite_errors = ["tests.crash.kind_agent:Rejected"]\n'
    if backoff:
        body += f"backoff = {backoff}\n"
    return f"[targets.{TARGET[kind]}]\n{body}"


async def _pay(http: aiohttp.ClientSession, api: str, place: Any, key: str) -> Any:
    headers, form = place(key, {"amount": "4800", "currency": "cny", "description": "refund order 123"})
    async with http.post(f"{api}/v1/payment_intents", data=form, headers=headers) as r:
        body = await r.json()
        if 400 <= r.status < 500:
            raise Rejected(str(body))
        if r.status != 200:
            raise ConnectionError(f"HTTP {r.status}: {body}")
        return payment.recorded(body, r.headers)


async def _open_ticket(http: aiohttp.ClientSession, api: str, place: Any, key: str) -> Any:
    fields = place(key, {"summary": "refund order 123 failed twice", "project": {"key": "OPS"}})
    async with http.post(f"{api}/rest/api/2/issue", json={"fields": fields}) as r:
        body = await r.json()
        if 400 <= r.status < 500:
            raise Rejected(str(body))
        if r.status != 201:
            raise ConnectionError(f"HTTP {r.status}: {body}")
        return body


async def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    targets = Path(args.workdir) / "targets.toml"
    targets.write_text(declaration(args.kind, args.api, args.search_lag, args.backoff))
    # Kafka mode: the intent is on Kafka before the call (sync), so that a restart on another host,
    # with an empty disk, learns of it through the ledger processor (lookup).
    kafka = KafkaConfig.from_env(bootstrap=args.kafka, prefix=args.prefix) if args.kafka else None
    db = str(Path(args.workdir) / "effects.db")
    async with await Ledger.open(
        db,
        targets=str(targets),
        kafka=kafka,
        sync=kafka is not None,
        lookup=args.lookup,
        confirm_within=1.0,  # the deadline adds little to the short --timeout: the cells wait little
    ) as ledger:
        place = ledger.target(TARGET[args.kind]).reconciler.place  # type: ignore[union-attr]
        send = _pay if args.kind == "payment" else _open_ticket
        async with aiohttp.ClientSession() as http:
            loop = asyncio.get_running_loop()
            give_up = loop.time() + args.patience
            while True:
                try:
                    c = await ledger.execute(
                        target=TARGET[args.kind],
                        operation=OPERATION[args.kind],
                        run_id=args.run_id,
                        step="order-123",
                        request={"order": "123", "amount": 4800},
                        call=lambda key: send(http, args.api, place, key),
                        timeout=args.timeout,
                    )
                    return EXIT_OK, {"result": "confirmed", "key": c.effect_id, "receipt_id": c.receipt_id}
                except EffectInProgress as e:
                    # An earlier attempt may still land (or the index catch up): wait, then ask again.
                    if loop.time() >= give_up:
                        return EXIT_IN_PROGRESS, {"result": "in_progress", "reason": str(e)}
                    await asyncio.sleep(min(1.0, max(0.05, (e.retry_after_ms or 200) / 1000)))
                except LedgerUnavailable as e:
                    # Kafka or the processor cannot vouch for the key yet: hold, ask again shortly.
                    if loop.time() >= give_up:
                        return EXIT_IN_PROGRESS, {"result": "unavailable", "reason": str(e)}
                    await asyncio.sleep(0.2)
                except EffectUncertain as e:
                    return EXIT_UNCERTAIN, {"result": "uncertain", "key": e.effect_id, "state": e.state}
                except Rejected as e:
                    return EXIT_REJECTED, {"result": "rejected", "reason": str(e)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.crash.kind_agent")
    p.add_argument("--kind", choices=tuple(TARGET), required=True)
    p.add_argument("--api", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--search-lag", default="1s")
    p.add_argument("--backoff", default="")
    p.add_argument("--timeout", type=float, default=1.0)
    p.add_argument("--patience", type=float, default=30.0)
    p.add_argument("--kafka", default=None, help="Kafka mode: bootstrap servers")
    p.add_argument("--prefix", default=None, help="Kafka mode: topic prefix")
    p.add_argument("--lookup", default=None, help="Kafka mode: the ledger processor's URL")
    args = p.parse_args(argv)
    code, out = asyncio.run(run(args))
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
