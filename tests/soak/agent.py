"""One agent "host" of the soak: its own ledger file and worker identity, Kafka mode through the SDK
(``sync=True``: the intent is on Kafka before the destination is called), executing refunds at a
steady rate across the three destinations of ``tests.soak.destinations``.

    python -m tests.soak.agent --db FILE --bootstrap B --prefix P --partitions N --targets FILE \\
        --urls JSON --rate R --host a --incarnation 0

Keys are ``soak.<host><incarnation>.<n>``: a restarted host (after its kill -9) starts a fresh
series, and what its predecessor left open is the reconcilers' to settle. Every 5 s and at the end
one JSON line of counts goes to stdout. SIGTERM: stop starting calls, finish those in flight (at
most 30 s), close the ledger (its relay sends what the file still holds), print the counts, exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections import Counter

from effect_ledger.demo.client import GatewayClient
from effect_ledger.errors import LedgerError
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig

#: Calls at once. Past it the calls due wait, as a task queue's would, and start as others end;
#: those still waiting when the load stops were never started ("behind"). A call waits for the
#: worker's claim answer, ~1-2 s when every process of the soak shares 2 cores: at 250 calls/s a
#: host needs 250-500 in flight, more after a worker's kill.
MAX_IN_FLIGHT = 1500


async def run(a: argparse.Namespace) -> None:
    urls: dict[str, str] = json.loads(a.urls)
    names = sorted(urls)
    cfg = KafkaConfig(bootstrap=a.bootstrap, prefix=a.prefix, partitions=a.partitions)
    counts: Counter[str] = Counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with await Ledger.open(a.db, targets=a.targets, kafka=cfg, sync=True) as ledger:
        clients = {n: GatewayClient(urls[n]) for n in names}
        for c in clients.values():
            await c.__aenter__()
        tasks: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            target = names[i % len(names)]
            key = f"soak.{a.host}{a.incarnation}.{i}"
            gw = clients[target]
            try:
                c = await ledger.execute(
                    target=target, operation="refund.create", key=key, request={"order": key, "amount": 100},
                    call=lambda k: gw.refund(key, 100, idempotency_key=k), timeout=a.timeout,
                )  # fmt: skip
                counts["called" if c.called else "recorded"] += 1
            except LedgerError as e:
                counts[type(e).__name__] += 1
            except Exception as e:  # counted, never fatal: the soak goes on
                counts[f"unexpected {type(e).__name__}"] += 1

        def report(final: bool = False) -> None:
            # "started": the calls due so far (the rate asked), "behind": those of them not started
            # yet, "backlog_max": the most that ever waited at once.
            print(json.dumps({"host": a.host, "incarnation": a.incarnation, "started": due, "behind": due - n,
                              "in_flight": len(tasks), "worker": ledger.worker, "final": final, **counts}),
                  flush=True)  # fmt: skip

        n = due = 0
        t0 = time.monotonic()
        last_report = t0
        print(json.dumps({"ready": ledger.worker}), flush=True)
        while not stop.is_set():
            due = int((time.monotonic() - t0) * a.rate)
            counts["backlog_max"] = max(counts["backlog_max"], due - n)
            while n < due and len(tasks) < MAX_IN_FLIGHT:
                t = asyncio.create_task(one(n))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                n += 1
            if time.monotonic() - last_report >= 5:
                report()
                last_report = time.monotonic()
            try:
                await asyncio.wait_for(stop.wait(), 0.01)
            except TimeoutError:
                pass
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        report(final=True)
        for c in clients.values():
            await c.__aexit__(None, None, None)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.soak.agent")
    p.add_argument("--db", required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--targets", required=True)
    p.add_argument("--urls", required=True, help="JSON: target name -> gateway URL")
    p.add_argument("--rate", type=float, required=True, help="effects per second")
    p.add_argument("--host", required=True)
    p.add_argument("--incarnation", type=int, default=0)
    p.add_argument("--timeout", type=float, default=2.0, help="each call's timeout (its deadline), s")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
