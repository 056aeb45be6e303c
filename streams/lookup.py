"""Asking the ledger processor about a key (Kafka mode, an agent restarted on another host)."""

from __future__ import annotations

import base64
from urllib.parse import quote

import aiohttp

from effect_ledger.streams.errors import LedgerLagging, LedgerUnavailable


class ProcessorLookup:
    """``GET {url}/effects/{key}`` on any processor worker (it routes to the owner of the key)."""

    def __init__(self, url: str, timeout: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def events(self, key: str) -> list[bytes]:
        """The key's events as the processor's table holds them ([] when it knows none). Raises
        ``LedgerLagging`` when the processor has not caught up with what Kafka acknowledged, and
        ``LedgerUnavailable`` when it cannot be asked: never an empty answer it cannot vouch for."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{self.url}/effects/{quote(key, safe='')}"
        try:
            async with self._session.get(url) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise LedgerUnavailable(f"cannot ask the ledger processor at {self.url}: {type(e).__name__}: {e}") from e
        if status == 404 and body.get("known") is False:
            return []
        if status == 503 and body.get("lagging"):
            raise LedgerLagging(
                f"processor lags on partition {body.get('partition')}: consumed {body.get('processed')}, "
                f"high watermark {body.get('high_watermark')}"
            )
        if status != 200:
            raise LedgerUnavailable(f"ledger processor answered {status} for {key}: {body}")
        return [base64.b64decode(e) for e in body.get("events", [])]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
