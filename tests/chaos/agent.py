"""One agent host of ``make chaos``: its own ledger file, Kafka mode through the SDK (``sync=True``
and a processor ``lookup``: claims across hosts), refunds at a steady rate, and every operation in
its history (JSON lines, as Jepsen keeps one):

    {"t": <monotonic s>, "host": "a", "op": "invoke", "key": ..., "target": ..., "amount": ...}
    {"t": ..., "host": "a", "op": "ok", "key": ..., "receipt": ..., "amount": ..., "called": true}
    {"t": ..., "host": "a", "op": "fail", "key": ..., "error": "EffectConflict"}
    {"t": ..., "host": "a", "op": "info", "key": ..., "error": "EffectUncertain"}

``ok``: the caller holds a receipt (``amount`` is the one the destination's answer names: a receipt
of another request under the same key shows there). ``fail``: the ledger says no call of this
caller happened (it refused before calling: the intent or the claim was not acknowledged, another
host owns the key, a conflict). ``info``: it may have happened (the call's outcome is unknown).
Times are ``time.monotonic()``: one clock for every process on the machine, which a skewed wall
clock (libfaketime with ``FAKETIME_DONT_FAKE_MONOTONIC=1``) does not move.

Every tenth operation is a race: both hosts execute key ``race.<n>`` on the deduplicating
destination, ``n`` the number of the second (on the machine's monotonic clock) in which they start
it, each with its own amount (host a 100 + n, host b 200 + n): one may pay, the other must get a
conflict, never the first one's receipt. Other keys are ``c.<host><incarnation>.<i>`` (a host
restarted, for a clock skew, starts a fresh series).

    python -m tests.chaos.agent --db FILE --history FILE --bootstrap B --prefix P --partitions N \\
        --targets FILE --urls JSON --lookup URL --rate R --host a

SIGTERM: stop starting calls, finish those in flight (at most 30 s), close the ledger, exit.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import signal
import time
from typing import IO, Any

from effect_ledger.demo.client import GatewayClient
from effect_ledger.errors import (
    DefiniteFailure,
    EffectConflict,
    EffectInProgress,
    InvalidEffect,
    LedgerUnavailable,
)
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig

MAX_IN_FLIGHT = 400
RACE_EVERY = 10
AMOUNT = {"a": 100, "b": 200}
#: Refusals that come before any call of this caller (the SDK calls only once its intent and claim
#: are acknowledged): the history's ``fail``.
REFUSED_BEFORE_CALL = (EffectConflict, EffectInProgress, LedgerUnavailable, InvalidEffect, DefiniteFailure)


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_CLOCK_GETTIME = 228  # x86_64
_CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def machine_monotonic() -> float:
    """The kernel's CLOCK_MONOTONIC by a raw system call: libfaketime, which skews this process's
    clocks (monotonic ones included), does not see it, so every history shares one time line."""
    ts = _Timespec()
    if _libc.syscall(_SYS_CLOCK_GETTIME, _CLOCK_MONOTONIC, ctypes.byref(ts)) != 0:
        return time.monotonic()
    return ts.tv_sec + ts.tv_nsec / 1e9


class History:
    def __init__(self, f: IO[str], host: str) -> None:
        self.f, self.host = f, host

    def error(self, key: str, e: Exception) -> None:
        """A call that ended in ``e``: ``fail`` when the ledger refused before any call of this caller,
        else ``info`` (a ledger error after the call, or the call's own error, a gateway's 503: it may
        have landed)."""
        self.log("fail" if isinstance(e, REFUSED_BEFORE_CALL) else "info", key, error=type(e).__name__,
                 why=str(e)[:200])  # fmt: skip

    def log(self, op: str, key: str, **more: Any) -> None:
        self.f.write(json.dumps({"t": round(machine_monotonic(), 4), "host": self.host, "op": op, "key": key, **more}))
        self.f.write("\n")
        self.f.flush()


async def run(a: argparse.Namespace) -> None:
    urls: dict[str, str] = json.loads(a.urls)
    names = sorted(urls)
    cfg = KafkaConfig(bootstrap=a.bootstrap, prefix=a.prefix, partitions=a.partitions)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    with open(a.history, "a", encoding="utf-8") as f:
        h = History(f, a.host)
        async with await Ledger.open(a.db, targets=a.targets, kafka=cfg, sync=True, lookup=a.lookup) as ledger:
            clients = {n: GatewayClient(urls[n]) for n in names}
            for c in clients.values():
                await c.__aenter__()
            tasks: set[asyncio.Task[None]] = set()

            async def one(i: int) -> None:
                if i % RACE_EVERY == 0 and "keyed" in urls:
                    second = int(machine_monotonic())
                    target, key, amount = "keyed", f"race.{second}", AMOUNT.get(a.host, 300) + second % 1000
                else:
                    target, key, amount = (
                        names[i % len(names)],
                        f"c.{a.host}{a.incarnation}.{i}",
                        AMOUNT.get(a.host, 300),
                    )
                gw = clients[target]
                h.log("invoke", key, target=target, amount=amount)
                try:
                    c = await ledger.execute(
                        target=target, operation="refund.create", key=key, request={"order": key, "amount": amount},
                        call=lambda k: gw.refund(key, amount, idempotency_key=k), timeout=a.timeout,
                    )  # fmt: skip
                    value = c.value if isinstance(c.value, dict) else {}
                    h.log("ok", key, receipt=c.receipt_id, amount=value.get("amount"), called=c.called)
                except Exception as e:
                    h.error(key, e)

            n = 0
            t0 = time.monotonic()
            print(json.dumps({"ready": ledger.worker}), flush=True)
            while not stop.is_set():
                due = int((time.monotonic() - t0) * a.rate)
                while n < due and len(tasks) < MAX_IN_FLIGHT:
                    t = asyncio.create_task(one(n))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    n += 1
                if n < due:  # past MAX_IN_FLIGHT: the calls not started are skipped, not queued
                    h.log("skip", "", count=due - n)
                    n = due
                try:
                    await asyncio.wait_for(stop.wait(), 0.02)
                except TimeoutError:
                    pass
            if tasks:
                await asyncio.wait(tasks, timeout=30)
            for c in clients.values():
                await c.__aexit__(None, None, None)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.agent")
    p.add_argument("--db", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--targets", required=True)
    p.add_argument("--urls", required=True, help="JSON: target name -> gateway URL")
    p.add_argument("--lookup", required=True, help="the workers' lookup URLs, comma-separated, in order")
    p.add_argument("--rate", type=float, required=True, help="effects per second")
    p.add_argument("--host", required=True)
    p.add_argument("--incarnation", type=int, default=0)
    p.add_argument("--timeout", type=float, default=2.0, help="each call's timeout (its deadline), s")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
