"""The agent's side of the gateway: an HTTP client whose errors are classified the way
effect-ledger needs them (a definite rejection vs. an unknown outcome)."""

from __future__ import annotations

import socket
import struct
from typing import Any

import aiohttp

from effect_ledger.errors import DefiniteFailure


class RefundRejected(DefiniteFailure):
    """The gateway said no (4xx): no refund was made."""


class GatewayUnavailable(Exception):
    """5xx or a transport error: the refund may or may not have been made."""


def resetting_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A TCP socket whose close is a reset (``SO_LINGER`` 0). A call the ledger cut off at its
    deadline closes its connection: with an orderly close the kernel would go on retransmitting a
    request a network partition held back, and deliver it once the partition heals, long after the
    deadline and the target's ``lands_within``, when a reconciler may already have found the key
    absent. A reset drops what the kernel still holds instead."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


class GatewayClient:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> GatewayClient:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30), connector=aiohttp.TCPConnector(socket_factory=resetting_socket)
        )
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
