"""Asking the ledger processor about a key (Kafka mode, an agent restarted on another host)."""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

import aiohttp

from effect_ledger.streams.errors import EffectRetired, LedgerLagging, LedgerUnavailable
from effect_ledger.streams.keyurl import key_url

TOKEN_ENV = "EFFECTS_WEB_TOKEN"


class ProcessorLookup:
    """``GET {url}/effects/{key}`` on any processor worker (it routes to the owner of the key).

    ``token``: the processor's lookup token (``effects worker --web-token`` / ``EFFECTS_WEB_TOKEN``),
    sent as ``Authorization: Bearer``; by default read from ``EFFECTS_WEB_TOKEN``."""

    def __init__(self, url: str, timeout: float = 15.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._template = self.url.replace("{", "{{").replace("}", "}}") + "/effects/{key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        token = os.environ.get(TOKEN_ENV) if token is None else token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    async def events(self, key: str) -> list[bytes]:
        """The key's events as the processor's table holds them ([] when it knows none). Raises
        ``LedgerLagging`` when the processor has not caught up with what Kafka acknowledged, and
        ``LedgerUnavailable`` when it cannot be asked, or answers anything but an answer about this
        very key: never an empty answer it cannot vouch for."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            url = key_url(self._template, key)
            # No redirects: an answer from elsewhere is not the processor's, and the token stays here.
            async with self._session.get(url, headers=self._headers, allow_redirects=False) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise LedgerUnavailable(f"cannot ask the ledger processor at {self.url}: {type(e).__name__}: {e}") from e
        if status == 401:
            raise LedgerUnavailable(
                f"the ledger processor at {self.url} refused the lookup (401): give its token "
                f"(Ledger.open(lookup_token=...) or {TOKEN_ENV})"
            )
        if status == 503 and isinstance(body, dict) and body.get("lagging"):
            raise LedgerLagging(
                f"processor lags on partition {body.get('partition')}: consumed {body.get('processed')}, "
                f"high watermark {body.get('high_watermark')}"
            )
        return _events_of(status, body, key, self.url)

    async def close(self) -> None:
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
        # Retired (streams/retention.py): never executed again, whatever its last state.
        raise EffectRetired(key, str(body.get("state")), int(body.get("retired_ms") or 0))
    events = body.get("events")
    if status != 200 or body.get("known") is not True or not isinstance(events, list):
        raise refuse("not a lookup answer")
    try:
        return [base64.b64decode(e, validate=True) for e in events]
    except (binascii.Error, TypeError, ValueError) as e:
        raise refuse(f"events that are not base64 ({e})") from e
