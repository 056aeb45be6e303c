"""One workflow step whose effect lands in a real destination of a built-in kind, run as a child
process so it can be killed for real (``EFFECT_LEDGER_CRASH=<point>``):

    python -m tests.crash.destination_agent --targets FILE --workdir DIR --kind smtp|sql --run-id R

``smtp``: sends an order confirmation with a PDF attachment through the ``mail`` target;
``sql``: takes 2 of ``sku-1`` from the stock through the ``orders`` target. ``--mode naive`` is
how such a step is usually written: the same call with a fresh key per attempt and a checkpoint
after it (so the test can see the duplicate a crash between the two makes). Prints one JSON line;
exit code 0 confirmed, 3 uncertain/escalated, 4 rejected, 5 still in progress after ``--patience``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from effect_ledger.errors import DefiniteFailure, EffectInProgress, EffectUncertain
from effect_ledger.sdk import crashpoints
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.targets.load import load_targets
from effect_ledger.targets.mail import MailDestination
from effect_ledger.targets.sql import SqlDestination

EXIT_OK, EXIT_UNCERTAIN, EXIT_REJECTED, EXIT_IN_PROGRESS = 0, 3, 4, 5
TARGET = {"smtp": "mail", "sql": "orders"}
OPERATION = {"smtp": "mail.send", "sql": "stock.take"}
STEP = "order-123"


def confirmation_mail(order: str = "123") -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "sender@example.test"
    msg["To"] = "customer@example.test"
    msg["Subject"] = f"Your order {order}"
    msg.set_content(f"Thank you for your order {order}.")
    msg.add_attachment(b"%PDF-1.4 invoice 123\n" * 200, maintype="application", subtype="pdf", filename="invoice.pdf")
    return msg


async def do(dest: object, key: str, order: str) -> Any:
    if isinstance(dest, MailDestination):
        return await dest.send(key, confirmation_mail(order))
    assert isinstance(dest, SqlDestination)
    return await dest.decrement(key, "sku-1", 2, {"order_id": order})


async def run_naive(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    checkpoint = Path(args.workdir) / "naive-checkpoint.json"
    if checkpoint.exists():
        return EXIT_OK, {"result": "confirmed", "called": False}
    crashpoints.reached(crashpoints.BEFORE_INTENT)
    crashpoints.reached(crashpoints.AFTER_INTENT)
    dest = {t.name: t for t in load_targets(args.targets)}[TARGET[args.kind]].reconciler
    out = await do(dest, f"naive-{uuid.uuid4().hex}", args.order)
    crashpoints.reached(crashpoints.AFTER_CALL)
    crashpoints.reached(crashpoints.AFTER_EXECUTED)
    checkpoint.write_text(json.dumps(out))
    return EXIT_OK, {"result": "confirmed", "called": True}


async def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    async with await Ledger.open(str(Path(args.workdir) / "effects.db"), targets=args.targets) as ledger:
        dest = ledger.target(TARGET[args.kind]).reconciler

        async def call(key: str) -> Any:
            return await do(dest, key, args.order)

        loop = asyncio.get_running_loop()
        give_up = loop.time() + args.patience
        while True:
            try:
                c = await ledger.execute(
                    target=TARGET[args.kind], operation=OPERATION[args.kind], run_id=args.run_id, step=STEP,
                    request={"order": "123"}, call=call, timeout=args.timeout,
                )  # fmt: skip
                return EXIT_OK, {
                    "result": "confirmed",
                    "key": c.effect_id,
                    "receipt_id": c.receipt_id,
                    "called": c.called,
                }
            except EffectInProgress as e:
                # An earlier attempt may still land until its deadline: wait it out, then ask again.
                if loop.time() >= give_up:
                    return EXIT_IN_PROGRESS, {"result": "in_progress", "reason": str(e)}
                await asyncio.sleep(min(1.0, max(0.05, (e.retry_after_ms or 200) / 1000)))
            except EffectUncertain as e:
                # Still being reconciled (UNCERTAIN): a workflow holds and asks again, as it would after
                # EffectInProgress; escalated (a person decides) or out of patience: report it.
                if e.state == "UNCERTAIN" and loop.time() < give_up:
                    await asyncio.sleep(0.2)
                    continue
                return EXIT_UNCERTAIN, {"result": "uncertain", "key": e.effect_id, "state": e.state, "reason": e.reason}
            except DefiniteFailure as e:
                return EXIT_REJECTED, {"result": "rejected", "reason": str(e)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.crash.destination_agent")
    p.add_argument("--mode", choices=("ledger", "naive"), default="ledger")
    p.add_argument("--order", default="123")
    p.add_argument("--targets", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--kind", choices=sorted(TARGET), required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--timeout", type=float, default=3.0)  # a call deadline a loaded machine meets
    p.add_argument("--patience", type=float, default=30.0)
    args = p.parse_args(argv)
    code, out = asyncio.run(run(args) if args.mode == "ledger" else run_naive(args))
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
