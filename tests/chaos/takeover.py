"""The zombie's successor: while an agent host is frozen (``zombie-agent``), past its calls' deadlines,
another host executes the calls the frozen one had started and not finished, with the same keys and
requests, as a restarted replica of it would. The ledger must let at most one of them pay: the
successor waits while the frozen host's attempt is still open (``EffectInProgress``), and calls only
once the reconcilers have said it is absent; the frozen host, when it wakes, must not call what the
successor now owns. The checker counts a key paid twice, or two calls that both report they made it.

    python -m tests.chaos.takeover --history-of FILE --db FILE --history FILE --bootstrap B \\
        --prefix P --partitions N --targets FILE --urls JSON --lookup URL --host t --within S
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from effect_ledger.demo.client import GatewayClient
from effect_ledger.errors import EffectInProgress, LedgerUnavailable
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from tests.chaos.agent import History


def unfinished(path: str) -> list[dict[str, object]]:
    """The calls of a history that were invoked and have no answer yet."""
    open_: dict[str, dict[str, object]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("op") == "invoke":
                open_[r["key"]] = r
            elif r.get("op") in ("ok", "fail", "info"):
                open_.pop(r["key"], None)
    return list(open_.values())


async def run(a: argparse.Namespace) -> None:
    urls: dict[str, str] = json.loads(a.urls)
    cfg = KafkaConfig(bootstrap=a.bootstrap, prefix=a.prefix, partitions=a.partitions)
    todo = unfinished(a.history_of)
    print(json.dumps({"taking_over": [t["key"] for t in todo]}), flush=True)
    with open(a.history, "a", encoding="utf-8") as f:
        h = History(f, a.host)
        async with await Ledger.open(a.db, targets=a.targets, kafka=cfg, sync=True, lookup=a.lookup) as ledger:
            clients = {n: GatewayClient(u) for n, u in urls.items()}
            for c in clients.values():
                await c.__aenter__()

            async def one(item: dict[str, object]) -> None:
                key, target, amount = str(item["key"]), str(item["target"]), int(item["amount"])  # type: ignore[call-overload]
                gw = clients[target]
                h.log("invoke", key, target=target, amount=amount)
                end = time.monotonic() + a.within
                while True:
                    try:
                        c = await ledger.execute(
                            target=target, operation="refund.create", key=key,
                            request={"order": key, "amount": amount},
                            call=lambda k: gw.refund(key, amount, idempotency_key=k), timeout=a.timeout,
                        )  # fmt: skip
                        value = c.value if isinstance(c.value, dict) else {}
                        h.log("ok", key, receipt=c.receipt_id, amount=value.get("amount"), called=c.called)
                        return
                    except (EffectInProgress, LedgerUnavailable) as e:  # not ours yet: ask again
                        if time.monotonic() >= end:
                            h.error(key, e)
                            return
                        await asyncio.sleep(1.0)
                    except Exception as e:
                        h.error(key, e)
                        return

            await asyncio.gather(*(one(t) for t in todo))
            for c in clients.values():
                await c.__aexit__(None, None, None)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.takeover")
    p.add_argument("--history-of", required=True, help="the frozen host's history")
    p.add_argument("--db", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--targets", required=True)
    p.add_argument("--urls", required=True)
    p.add_argument("--lookup", required=True)
    p.add_argument("--host", default="t")
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--within", type=float, default=60.0, help="how long to keep asking for each key, s [60]")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
