"""The agent's side of the gateway: an HTTP client whose errors are classified the way
effect-ledger needs them (a definite rejection vs. an unknown outcome)."""

from __future__ import annotations

from typing import Any

import aiohttp

from effect_ledger.errors import DefiniteFailure


class RefundRejected(DefiniteFailure):
    """The gateway said no (4xx): no refund was made."""


class GatewayUnavailable(Exception):
    """5xx or a transport error: the refund may or may not have been made."""


class GatewayClient:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> GatewayClient:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def refund(
        self, order: str, amount: int, currency: str = "CNY", *, idempotency_key: str | None
    ) -> dict[str, Any]:
        assert self._session is not None, "use 'async with GatewayClient(url)'"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = {"order": order, "amount": amount, "currency": currency}
        async with self._session.post(f"{self.url}/refunds", json=body, headers=headers) as resp:
            data = await resp.json()
            if resp.status == 200:
                return data  # type: ignore[no-any-return]
            if 400 <= resp.status < 500 and resp.status not in (408, 409, 429):
                raise RefundRejected(f"{resp.status} {data.get('error')}: {data.get('message', '')}")
            raise GatewayUnavailable(f"{resp.status} {data.get('error')}")
