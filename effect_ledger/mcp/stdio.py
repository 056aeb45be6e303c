"""The proxy over stdio: the agent launches ``effects mcp-proxy ... -- SERVER COMMAND``, and the
proxy launches the server and relays newline-delimited JSON-RPC both ways.

Every line passes through byte for byte, except a write tool's ``tools/call`` (answered through the
ledger, see ``calls``) and the server's responses to requests the proxy sent itself. The server
inherits the proxy's environment (less ``EFFECT_LEDGER_CRASH``) and its stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

from effect_ledger.mcp.calls import WriteCalls
from effect_ledger.mcp.wire import (
    INVALID_REQUEST,
    MAX_MESSAGE_BYTES,
    Pending,
    UpstreamLost,
    encode,
    error_response,
    is_response,
    read_lines,
)
from effect_ledger.sdk import crashpoints

SERVER_EXIT_GRACE_S = 5.0  # after the agent hangs up, the server gets this long to exit on its own


class _Lines:
    """One writer of whole lines: a message is never interleaved with another."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._lock = asyncio.Lock()

    async def send(self, data: bytes) -> None:
        async with self._lock:
            self._writer.write(data if data.endswith(b"\n") else data + b"\n")
            await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


class _StdioUpstream:
    def __init__(self, to_server: _Lines, pending: Pending) -> None:
        self._to_server = to_server
        self._pending = pending

    async def refuses_caller(self) -> str | None:
        return None  # one agent, the one that launched this proxy and its server

    async def request(self, method: str, params: dict[str, Any], request_id: Any = None) -> dict[str, Any]:
        rid = self._pending.new_id() if request_id is None else request_id
        fut = self._pending.expect(rid)
        try:
            try:
                await self._to_server.send(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
            except (ConnectionError, RuntimeError) as e:
                raise UpstreamLost(f"cannot write to the MCP server: {e}") from e
            return await fut
        finally:
            self._pending.release(rid)


async def serve_stdio(calls: WriteCalls, command: list[str]) -> int:
    """Relay between this process's stdin/stdout (the agent) and ``command`` (the server) until
    either side ends; returns the server's exit status."""
    loop = asyncio.get_running_loop()
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV}
    server = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, limit=MAX_MESSAGE_BYTES
    )
    assert server.stdin is not None and server.stdout is not None
    agent_in = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(agent_in), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout)
    to_agent = _Lines(asyncio.StreamWriter(transport, protocol, None, loop))
    to_server = _Lines(server.stdin)
    pending = Pending()
    upstream = _StdioUpstream(to_server, pending)
    session_run = f"stdio:{uuid.uuid4().hex}"  # one agent connection; gone when the proxy restarts
    in_flight: set[asyncio.Task[None]] = set()

    async def answer(msg: dict[str, Any]) -> None:
        await to_agent.send(encode(await calls.handle(msg, upstream, session_run)))

    async def from_agent() -> None:
        async for line in read_lines(agent_in):
            if line is None:
                await to_agent.send(encode(error_response(None, INVALID_REQUEST, _too_long())))
                continue
            forward = line
            msg = _parse(line)
            if calls.is_write_call(msg):
                task = asyncio.create_task(answer(msg))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                continue
            if isinstance(msg, list):
                rest = [m for m in msg if not calls.is_write_call(m)]
                for m in msg:
                    if calls.is_write_call(m):
                        refusal = "effect-ledger: send a write tool call on its own, not in a batch"
                        await to_agent.send(encode(error_response(m.get("id"), INVALID_REQUEST, refusal)))
                if not rest:
                    continue
                forward = encode(rest) if len(rest) != len(msg) else line
            try:
                await to_server.send(forward)
            except (ConnectionError, RuntimeError):
                return
        # The agent hung up: let answers in flight finish, then close the server's stdin.
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
        to_server.close()
        try:
            await asyncio.wait_for(server.wait(), SERVER_EXIT_GRACE_S)
        except TimeoutError:
            server.terminate()

    async def from_server() -> None:
        assert server.stdout is not None
        async for line in read_lines(server.stdout):
            if line is None:
                print(f"effects mcp-proxy: dropped a server message over {MAX_MESSAGE_BYTES} bytes", file=sys.stderr)
                continue
            msg = _parse(line)
            if is_response(msg) and pending.deliver(msg):
                continue
            await to_agent.send(line)
        pending.lose("the MCP server closed its output before answering")

    agent_task = asyncio.create_task(from_agent())
    try:
        await from_server()
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
    finally:
        agent_task.cancel()
        to_agent.close()
    return await server.wait()


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None  # not JSON: passed through; the other side answers with a parse error


def _too_long() -> str:
    return f"effect-ledger: a message over {MAX_MESSAGE_BYTES} bytes was dropped"
