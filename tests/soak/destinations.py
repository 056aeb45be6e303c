"""The soak's destinations: three fake payment gateways (``effect_ledger.demo.gateway``)
in one child process, one of each kind that matters to reconciliation:

* ``keyed``: honours idempotency keys and answers lookups by key (``key+lookup``);
* ``lookup``: answers lookups by key, does not deduplicate (``lookup``);
* ``blind``: neither (``none``): an uncertain effect on it can only escalate.

Each gateway counts the refunds it made per idempotency key (``GET /_admin/refunds``): a key with
two refunds is a double execution. A share of calls fail on the gateway's own terms, drawn per call:
``lost`` (the refund is made, the reply is a 503) and ``slow`` (made, the reply comes after the
agent's call timeout), so effects pass their deadlines without a receipt.

    python -m tests.soak.destinations --lost 0.005 --slow 0.005 --slow-delay 3

prints one JSON line ``{"keyed": URL, "lookup": URL, "blind": URL}`` and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

from effect_ledger.demo.client import RefundRejected
from effect_ledger.demo.gateway import Gateway, GatewayState

KINDS = {"keyed": "key+lookup", "lookup": "lookup", "blind": "none"}
REJECTED = f"{RefundRejected.__module__}:{RefundRejected.__qualname__}"


class FlakyState(GatewayState):
    """A gateway whose calls fail at random, at given rates (``lost``, ``slow``)."""

    def __init__(self, kind: str, lost: float, slow: float, slow_delay: float, seed: int) -> None:
        super().__init__(kind)
        self.lost, self.slow, self.slow_delay = lost, slow, slow_delay
        self.rng = random.Random(seed)

    def create(self, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any], float]:
        with self.lock:
            r = self.rng.random()
            if r < self.lost:
                self.failures.insert(0, ("lost", 0.0))
            elif r < self.lost + self.slow:
                self.failures.insert(0, ("slow", self.slow_delay))
        return super().create(body, key)


def declaration(urls: dict[str, str]) -> str:
    """The targets file every agent and the reconciler read: one target per destination."""
    out = []
    for name, url in urls.items():
        lookup = "none" if KINDS[name] == "none" else f"{url}/refunds/by-key/{{key}}"
        honours = "true" if KINDS[name] == "key+lookup" else "false"
        out.append(
            f'[targets.{name}]\nlookup = "{lookup}"\nhonours_keys = {honours}\nkey_retention = "24h"\n'
            f'definite_errors = ["{REJECTED}"]\n'
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.soak.destinations")
    p.add_argument("--lost", type=float, default=0.005)
    p.add_argument("--slow", type=float, default=0.005)
    p.add_argument("--slow-delay", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--host", default="127.0.0.1", help="address the gateways listen on [127.0.0.1]")
    a = p.parse_args(argv)
    gateways = {
        name: Gateway(kind, state=FlakyState(kind, a.lost, a.slow, a.slow_delay, a.seed + i), host=a.host).start()
        for i, (name, kind) in enumerate(KINDS.items())
    }
    print(json.dumps({name: gw.url for name, gw in gateways.items()}), flush=True)
    sys.stdin.read()  # until the harness closes it (or dies)
    for gw in gateways.values():
        gw.stop()


if __name__ == "__main__":
    main()
