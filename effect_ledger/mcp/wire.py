"""JSON-RPC as the proxy sees it: messages are plain dicts, passed through unchanged unless they
are a write tool's ``tools/call``; requests the proxy sends itself wait for their answer here.

Sizes: one message (a stdio line, an HTTP body) is at most ``MAX_MESSAGE_BYTES``; a longer one is
refused with a JSON-RPC error (stdio: the line is skipped; HTTP: 413), never half-forwarded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any, Protocol

MAX_MESSAGE_BYTES = 16 << 20
MAX_ABANDONED = 4096  # ids given up on (deadline passed) whose late answer is dropped, not relayed
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603


class UpstreamLost(ConnectionError):
    """The connection to the MCP server ended before it answered: the outcome is unknown."""


class Upstream(Protocol):
    """A way to send one request to the MCP server and wait for its response message."""

    async def request(self, method: str, params: dict[str, Any], request_id: Any = None) -> dict[str, Any]:
        """Send ``method`` with ``params`` (under ``request_id``, or an id of the proxy's own) and
        return the server's response: a dict with ``result`` or ``error``. Raises ``UpstreamLost``."""
        ...

    async def refuses_caller(self) -> str | None:
        """Why the server would not serve the agent this request came from (None: it would), asked
        before a recorded result is returned without calling the tool."""
        ...


def error_response(request_id: Any, code: int, message: str) -> dict[str, Any]:
    """A JSON-RPC error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def result_response(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC result response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def is_response(msg: Any) -> bool:
    """A response (result or error) rather than a request or a notification."""
    return isinstance(msg, dict) and "method" not in msg and ("result" in msg or "error" in msg)


def encode(msg: Any) -> bytes:
    """One message as one line of compact JSON."""
    return json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class Pending:
    """Requests the proxy sent upstream and waits on, by id. Ids of the proxy's own requests carry a
    per-process prefix, so they cannot collide with the agent's."""

    def __init__(self) -> None:
        self._waiting: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self._prefix = f"effect-ledger-{os.getpid()}-{os.urandom(4).hex()}-"
        self._counter = itertools.count(1)
        self._lost: str | None = None
        self._abandoned: OrderedDict[tuple[str, Any], None] = OrderedDict()

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._counter)}"

    def expect(self, request_id: Any) -> asyncio.Future[dict[str, Any]]:
        """A future resolved by the response with ``request_id``."""
        if self._lost is not None:
            raise UpstreamLost(self._lost)
        key = _id_key(request_id)
        if key in self._waiting:
            raise UpstreamLost(f"request id {request_id!r} is already waiting for an answer")
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[key] = fut
        return fut

    def release(self, request_id: Any) -> None:
        """The requester stops waiting (answered, or given up). Given up: the agent already has an
        answer for this id (e.g. "outcome unknown"), so a late response must not reach it as a
        second answer; it is dropped."""
        key = _id_key(request_id)
        fut = self._waiting.pop(key, None)
        if fut is not None and not fut.done():
            fut.cancel()
            self._abandoned[key] = None
            if len(self._abandoned) > MAX_ABANDONED:
                self._abandoned.popitem(last=False)

    def deliver(self, msg: dict[str, Any]) -> bool:
        """Resolve the waiter of a response; False when it is not one of the proxy's (pass it on)."""
        key = _id_key(msg.get("id"))
        fut = self._waiting.get(key)
        if fut is None:
            if key in self._abandoned:  # a late answer nobody waits for any more: dropped
                del self._abandoned[key]
                return True
            return False
        if not fut.done():
            fut.set_result(msg)
        return True

    def lose(self, reason: str) -> None:
        """The connection ended: every waiter, and every later request, fails with ``UpstreamLost``."""
        self._lost = reason
        for fut in list(self._waiting.values()):
            if not fut.done():
                fut.set_exception(UpstreamLost(reason))


def _id_key(request_id: Any) -> tuple[str, Any]:
    # 1 and "1" are different JSON-RPC ids; True is not an id at all.
    return (type(request_id).__name__, request_id)


async def read_lines(reader: asyncio.StreamReader, limit: int = MAX_MESSAGE_BYTES) -> AsyncIterator[bytes | None]:
    """The lines of ``reader`` (without the newline); ``None`` stands for a line over ``limit``
    bytes, which is skipped whole."""
    buf = bytearray()
    skipping = False
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            if buf and not skipping:
                yield bytes(buf)
            return
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if not skipping:
                    buf += chunk[start:]
                    if len(buf) > limit:
                        buf.clear()
                        skipping = True
                break
            if skipping:
                skipping = False
                yield None
            else:
                buf += chunk[start:nl]
                if len(buf) > limit:
                    yield None
                else:
                    yield bytes(buf)
            buf.clear()
            start = nl + 1
