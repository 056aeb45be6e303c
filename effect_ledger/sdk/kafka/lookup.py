"""Asking the ledger processor about a key (Kafka mode, an agent restarted on another host)."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from effect_ledger.errors import EffectRetired, LedgerLagging, LedgerUnavailable
from effect_ledger.targets.keyurl import key_url

TOKEN_ENV = "EFFECTS_WEB_TOKEN"
_MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True, slots=True)
class FoldedThrough:
    """What a lookup waits for: the processor has folded the key's ``partition`` of effects.events
    through offset ``events`` (and of effects.decisions through ``decisions``; -1: nothing). An agent
    that wrote an intent knows its offset: the answer then holds the verdict on its claim."""

    partition: int
    events: int
    decisions: int = -1

    def params(self) -> dict[str, str]:
        """The query parameters that ask for it."""
        return {"partition": str(self.partition), "offset": str(self.events), "decisions_offset": str(self.decisions)}

    def query(self) -> str:
        """The same, to append to a query string (``?...``)."""
        return "".join(f"&{k}={v}" for k, v in self.params().items())


def folded_through_asked(query: Mapping[str, str], partition: int) -> FoldedThrough | str | None:
    """The ``FoldedThrough`` a lookup request asks for (None: none, wait for the high watermarks),
    or why the request is refused (the offsets are not numbers, or name another partition than the
    key's: the answer would not cover the agent's intent)."""
    if "offset" not in query:
        return None
    try:
        p = int(query.get("partition", ""))
        events = int(query["offset"])
        decisions = int(query.get("decisions_offset", "-1"))
    except ValueError:
        return "partition, offset and decisions_offset must be integers"
    if p != partition:
        return f"the key is on partition {partition}, not {p}"
    if not (-1 <= events <= _MAX_OFFSET and -1 <= decisions <= _MAX_OFFSET):
        return "offsets must be between -1 and 2**63-1"
    return FoldedThrough(p, events, decisions)


class ProcessorLookup:
    """``GET {url}/effects/{key}`` on any processor worker (it routes to the owner of the key).

    ``token``: the processor's lookup token (``effects worker --web-token`` / ``EFFECTS_WEB_TOKEN``),
    sent as ``Authorization: Bearer``; by default read from ``EFFECTS_WEB_TOKEN``."""

    def __init__(
        self,
        url: str,
        timeout: float = 15.0,
        token: str | None = None,
        watermarks: Callable[[str], Awaitable[FoldedThrough]] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._template = self.url.replace("{", "{{").replace("}", "}}") + "/effects/{key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        token = os.environ.get(TOKEN_ENV) if token is None else token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None
        # Where a key's partition stands on Kafka (claims.Watermarks.of): a lookup then names the
        # offsets it waits for. None: the processor asks the broker itself (slower).
        self._watermarks = watermarks
        self._on_close = on_close

    async def events(self, key: str, after: FoldedThrough | None = None) -> list[bytes]:
        """The key's events as the processor's table holds them ([] when it knows none), once it has
        folded ``after`` (by default: what Kafka had acknowledged when it was asked). Raises
        ``LedgerLagging`` when the processor has not caught up with what Kafka acknowledged, and
        ``LedgerUnavailable`` when it cannot be asked, or answers anything but an answer about this
        very key: never an empty answer it cannot vouch for."""
        if after is None and self._watermarks is not None:
            after = await self._watermarks(key)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            url = key_url(self._template, key)
            if after is not None:
                url = url.update_query(after.params())
            # No redirects: an answer from elsewhere is not the processor's, and the token stays here.
            async with self._session.get(url, headers=self._headers, allow_redirects=False) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise LedgerUnavailable(
                f"cannot ask the ledger processor at {self.url}: {type(e).__name__}: {e}", passing=True
            ) from e
        if status == 401:
            raise LedgerUnavailable(
                f"the ledger processor at {self.url} refused the lookup (401): give its token "
                f"(Ledger.open(lookup_token=...) or {TOKEN_ENV})"
            )
        if status == 503 and isinstance(body, dict) and body.get("lagging"):
            raise LedgerLagging(_lagging(body, self.url))
        return _events_of(status, body, key, self.url)

    async def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def _events_of(status: int, body: Any, key: str, url: str) -> list[bytes]:
    """Accept only the processor's answer about ``key``: 200 with its events, or 404 "not known".
    Anything else (another effect, no effect named, a page that is not the lookup view) is an error:
    reading it as "unknown key" would let this host execute again what another host did."""

    def refuse(why: str) -> LedgerUnavailable:
        return LedgerUnavailable(f"ledger processor at {url} answered {status} for {key}, {why}: {str(body)[:200]}")

    if not isinstance(body, dict):
        raise refuse("not a lookup answer")
    if body.get("effect_id") != key:
        raise refuse(f"about {body.get('effect_id')!r}, not the effect asked for")
    if status == 404 and body.get("known") is False:
        return []
    if status == 410 and body.get("retired") is True:
        # Retired (effect_ledger/core/retention.py): never executed again, whatever its last state.
        raise EffectRetired(key, str(body.get("state")), int(body.get("retired_ms") or 0))
    events = body.get("events")
    if status != 200 or body.get("known") is not True or not isinstance(events, list):
        raise refuse("not a lookup answer")
    try:
        return [base64.b64decode(e, validate=True) for e in events]
    except (binascii.Error, TypeError, ValueError) as e:
        raise refuse(f"events that are not base64 ({e})") from e


def _lagging(body: dict[str, Any], url: str) -> str:
    """Why the processor could not answer yet, in its own words: the offsets when it gave them,
    else its reason (starting, no owner of the partition, a silent peer, a slow broker)."""
    where = f"partition {body['partition']}" if body.get("partition") is not None else "the key's partition"
    if body.get("processed") is not None and body.get("high_watermark") is not None:
        return (
            f"the ledger processor at {url} lags on {where}: consumed through offset {body['processed']}, "
            f"high watermark {body['high_watermark']}"
        )
    reason = str(body.get("reason") or "no reason given")[:300]
    return f"the ledger processor at {url} cannot answer for {where} yet: {reason}"
