"""``GET /effects/{key}``: which worker answers, and when its answer may be given.

A lookup is routed to the worker that owns the key's partition of effects.events (any worker
forwards to it) and answers only once the table has consumed that partition (of both source
topics) up to the high watermarks seen when the request arrived (read-your-writes); after
``bound_s`` it answers 503 "lagging". It hands out only events (an SDK copies them into its own
ledger), and every answer names the ``effect_id`` it is about. With a token, every lookup must
carry it (``Authorization: Bearer``), else 401.

Everything the route needs from the worker is passed in (ownership, high watermarks, how far the
table is folded, the folded effect, a clock), so the rules here are tested without faust.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from effect_ledger.core.effect import Effect, to_state
from effect_ledger.sdk.kafka.lookup import FoldedThrough, folded_through_asked
from effect_ledger.streams.config import same_secret
from effect_ledger.streams.partition import partition_for
from effect_ledger.targets.keyurl import key_url

Answer = tuple[int, dict[str, Any]]


def authorized(token: str | None, authorization: str) -> bool:
    """No token configured (loopback only, see ``ProcessorSettings.check_web``), or the request
    carries it."""
    if not token:
        return True
    return same_secret(authorization, f"Bearer {token}")


@dataclass
class LookupRoute:
    partitions: int
    bound_s: float
    token: str | None
    own_url: str
    ready: Callable[[], bool]
    assigned: Callable[[], frozenset[int]]
    #: partition -> high watermarks (effects.events, effects.decisions), asked of the broker
    highwaters: Callable[[int], Awaitable[tuple[int, int]]]
    #: partition -> last offsets folded (effects.events, effects.decisions)
    folded: Callable[[int], tuple[int, int]]
    load: Callable[[str], Effect | None]
    encode_event: Callable[[Any], bytes]
    peers: Callable[[], set[str]] = set
    #: key -> the answer for a retired key (status 410), or None
    retired: Callable[[str], dict[str, Any] | None] = lambda _key: None
    clock: Callable[[], float] = time.monotonic
    #: why the processor is not ready (it is starting, or Kafka took one of its rights away)
    not_ready: Callable[[], str] = lambda: "the processor is starting"
    #: waits at most the given seconds for the fold to move on (the processor wakes it after
    #: every batch, so a lookup answers as soon as its offsets are folded)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    poll_s: float = 0.05

    async def get(
        self, key: str, authorization: str = "", owner_only: bool = False, query: Mapping[str, str] | None = None
    ) -> Answer:
        """The answer for ``key``: ``query`` may name the offsets to wait for (``partition``,
        ``offset``, ``decisions_offset``: an agent's own intent, for the verdict on its claim)."""
        if not authorized(self.token, authorization):
            return 401, {"error": "a lookup token is required (Authorization: Bearer)"}
        # faust serves the web view before the worker owns partitions: until then nobody can say
        # whether the table is complete.
        if not self.ready():
            return 503, {"lagging": True, "reason": self.not_ready()}
        p = partition_for(key.encode(), self.partitions)
        asked = folded_through_asked(query or {}, p)
        if isinstance(asked, str):
            return 400, {"effect_id": key, "error": asked}
        if p in self.assigned():
            return await self.lookup(key, p, asked)
        if owner_only:
            return 421, {"not_owner": True, "partition": p}
        return await self.forward(key, p, asked)

    async def lookup(self, key: str, p: int, asked: FoldedThrough | None = None) -> Answer:
        """Answer once the key's partition is folded through the offsets the agent asked for (the
        offset of its own intent: a claim answer), or else through the high watermarks now."""
        give_up = self.clock() + self.bound_s  # the whole answer, the broker's included
        if asked is not None:
            # The agent knows what it waits for: no broker round trip.
            hw, dhw = asked.events + 1, asked.decisions + 1
        else:
            try:  # a decision acknowledged before the request counts too
                hw, dhw = await asyncio.wait_for(self.highwaters(p), self.bound_s)
            except Exception as e:  # noqa: BLE001 - a timeout, or the broker's error: the client retries a 503
                return 503, {
                    "lagging": True,
                    "partition": p,
                    "owned": True,
                    "reason": f"the broker did not tell the high watermark within {self.bound_s:g} s"
                    f" ({type(e).__name__})",
                }
        while True:
            done, ddone = self.folded(p)
            if done >= hw - 1 and ddone >= dhw - 1:
                break
            if self.clock() >= give_up:
                return 503, {
                    "lagging": True,
                    "partition": p,
                    "high_watermark": hw,
                    "processed": done,
                    "owned": p in self.assigned(),
                }
            await self.sleep(self.poll_s)
        gone = self.retired(key)
        if gone is not None:
            return 410, gone
        effect = self.load(key)
        if effect is None:
            return 404, {"effect_id": key, "known": False, "partition": p, "high_watermark": hw}
        st = to_state(effect)
        return 200, {
            "effect_id": key,
            "known": True,
            "state": st.state.value,
            "attempt": st.attempt,
            "version": st.version,
            "receipt_id": st.receipt_id,
            "events": [base64.b64encode(self.encode_event(f)).decode() for f in effect.facts],
        }

    async def forward(self, key: str, partition: int, asked: FoldedThrough | None = None) -> Answer:
        """Ask the other workers for a key this one does not own. The owner is found by asking: it
        is whoever owns the key's partition of effects.events (faust's own table routing goes by
        the changelog's assignment, which is not always the same worker)."""
        import aiohttp

        urls = self.peers() - {self.own_url}
        timeout = aiohttp.ClientTimeout(total=self.bound_s + 5)
        # The workers of one app share the token (one setting for the cluster).
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        silent: list[str] = []  # workers that did not answer (busy, or gone)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            for url in sorted(urls):
                template = url.rstrip("/").replace("{", "{{").replace("}", "}}") + "/effects/{key}?owner-only=1"
                if asked is not None:
                    template += asked.query()
                try:
                    async with session.get(key_url(template, key), allow_redirects=False) as r:
                        if r.status == 421:
                            continue
                        return r.status, await r.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                    silent.append(f"{url}: {type(e).__name__}")
                    continue
        if silent:  # one of them may be the owner: say so, rather than that nobody owns it
            return 503, {
                "lagging": True,
                "partition": partition,
                "reason": f"the worker that may own the partition did not answer in time ({'; '.join(silent)})",
            }
        return 503, {"lagging": True, "partition": partition, "reason": "no worker owns the partition right now"}
