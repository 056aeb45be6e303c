"""The proxy over streamable HTTP: a reverse proxy in front of an MCP server's URL.

Every HTTP request (POST, GET event streams, DELETE, any path) is forwarded to the upstream origin
with its headers and body, and the answer streamed back unchanged (compressed bodies stay
compressed). Only a POST to the MCP endpoint whose body is a write tool's ``tools/call`` is answered
through the ledger, as one ``application/json`` response; the forwarded call carries the agent's
headers (session id, protocol version, authorization). Notifications the server streams while a
recorded call runs are not relayed. Bodies are at most ``MAX_MESSAGE_BYTES`` (413 beyond).

Who may use it: on loopback, any local process (like the console's reads). Beyond loopback, the
proxy refuses to start without a token of its own (``--token`` / ``EFFECTS_MCP_TOKEN``), which every
request must carry in ``TOKEN_HEADER`` (removed before forwarding: ``Authorization`` belongs to the
server). A recorded result is the answer to a call identity (``policy.call_identity``), whoever
retries it: a key never depends on a caller's credential, which may change between retries (a
refreshed OAuth token) and must not make a retry a second execution. So before a recorded result
is returned without calling the tool, the server is asked (a ``ping`` with the caller's headers)
whether it accepts this caller at all: a caller it refuses (401, 403) gets a refusal, not the result.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

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
from effect_ledger.streams.config import same_secret

SESSION_HEADER = "mcp-session-id"
TOKEN_HEADER = "Effect-Ledger-Token"  # the proxy's own credential (beyond loopback), never forwarded
NAME_HEADER = "mcp-name"  # mirrors params.name on 2026-07-28 requests: set for the proxy's own calls
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        TOKEN_HEADER.lower(),
    }
)


def _forwardable(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The end-to-end headers (repeated ones kept, e.g. Set-Cookie)."""
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


class _HttpUpstream:
    """Calls the server on behalf of one agent request, with that request's headers."""

    def __init__(self, client: aiohttp.ClientSession, url: str, headers: Mapping[str, str], pending: Pending) -> None:
        self._client = client
        self._url = url
        self._headers = _forwardable(headers)
        self._pending = pending

    async def request(self, method: str, params: dict[str, Any], request_id: Any = None) -> dict[str, Any]:
        rid = self._pending.new_id() if request_id is None else request_id
        headers = self._post_headers()
        if NAME_HEADER in headers and "name" in params:
            headers[NAME_HEADER] = str(params["name"])
        body = encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        try:
            async with self._client.post(self._url, data=body, headers=headers) as up:
                ctype = up.headers.get("Content-Type", "")
                if up.status >= 500 or up.status == 429:
                    raise UpstreamLost(f"the server answered HTTP {up.status}")
                if up.status >= 400:
                    said = _json(await _bounded_body(up))
                    if _answers(said, rid):  # the server's own answer to this call: judged like any
                        return {**said, "id": rid}
                    # Anything else (an OAuth 401 body, a proxy's error page) is the transport
                    # refusing the request: it never reached the tool, so the call is refused, not
                    # of unknown outcome (which would leave the key UNCERTAIN for its rightful caller).
                    return error_response(rid, INVALID_REQUEST, f"the server answered HTTP {up.status}")
                if ctype.startswith("text/event-stream"):
                    return await _from_event_stream(up, rid)
                raw = await _bounded_body(up)
                msg = _json(raw)
                if is_response(msg):
                    return {**msg, "id": rid}
                raise UpstreamLost(f"the server answered HTTP {up.status} without a JSON-RPC response")
        except aiohttp.ClientError as e:
            raise UpstreamLost(f"HTTP: {type(e).__name__}: {e}") from e

    def _post_headers(self) -> CIMultiDict[str]:
        """The agent's headers for a JSON-RPC POST of the proxy's own, whose answer it parses."""
        headers = self._headers.copy()
        headers.popall("Accept-Encoding", None)  # the answer is parsed here, not relayed
        headers["Content-Type"] = "application/json"
        headers["Accept"] = "application/json, text/event-stream"
        return headers

    async def refuses_caller(self) -> str | None:
        """Why the server will not serve this agent request's caller (None: it will): a ``ping``
        with the request's headers, answered 401 or 403, or not answered at all."""
        body = encode({"jsonrpc": "2.0", "id": self._pending.new_id(), "method": "ping"})
        try:
            async with self._client.post(self._url, data=body, headers=self._post_headers()) as up:
                if up.status in (401, 403):
                    return f"the server refused this caller (HTTP {up.status}): a recorded result is not given to it"
                return None
        except aiohttp.ClientError as e:
            return f"could not ask the server whether it accepts this caller ({type(e).__name__}); try again"


async def _bounded_body(up: aiohttp.ClientResponse) -> bytes:
    data = bytearray()
    async for chunk in up.content.iter_any():
        data += chunk
        if len(data) > MAX_MESSAGE_BYTES:
            raise UpstreamLost(f"the server's answer is over {MAX_MESSAGE_BYTES} bytes")
    return bytes(data)


async def _from_event_stream(up: aiohttp.ClientResponse, rid: Any) -> dict[str, Any]:
    data: list[bytes] = []
    async for line in read_lines(up.content):  # type: ignore[arg-type]  # aiohttp's reader reads like asyncio's
        if line is None:
            raise UpstreamLost(f"an event from the server is over {MAX_MESSAGE_BYTES} bytes")
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))
        elif not line and data:
            msg = _json(b"\n".join(data))
            data.clear()
            if is_response(msg) and msg.get("id") == rid:
                return dict(msg)
    raise UpstreamLost("the server's event stream ended before it answered")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _answers(msg: Any, rid: Any) -> bool:
    """A well-formed JSON-RPC 2.0 response to the request ``rid``: a result, or an error object."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or msg.get("id") != rid or "method" in msg:
        return False
    err = msg.get("error")
    return "result" in msg or (isinstance(err, dict) and isinstance(err.get("code"), int))


async def serve_http(
    calls: WriteCalls, upstream_url: str, host: str, port: int, stop: Any, token: str | None = None
) -> None:
    """Serve the proxy on ``host:port`` until ``stop`` (an ``asyncio.Event``) is set. The MCP
    endpoint is the upstream URL's path; every other path is forwarded too (OAuth metadata...).
    ``token``: every request must carry it in ``TOKEN_HEADER`` (required beyond loopback: the
    command refuses to start without one)."""
    parts = urlsplit(upstream_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise OSError(f"--upstream {upstream_url!r} is not an http(s) URL")
    origin = f"{parts.scheme}://{parts.netloc}"
    endpoint = parts.path or "/"
    pending = Pending()
    process_run = f"http:{uuid.uuid4().hex}"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    client = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def handle(request: web.Request) -> web.StreamResponse:
        if token:
            if not same_secret(request.headers.get(TOKEN_HEADER, ""), token):
                refusal = f"effect-ledger: this proxy needs its token in the {TOKEN_HEADER} header"
                return web.json_response(error_response(None, INVALID_REQUEST, refusal), status=401)
        body = await request.read() if request.can_read_body else b""
        if request.method == "POST" and request.path == endpoint:
            msg = _json(body)
            if calls.is_write_call(msg):
                session = request.headers.get(SESSION_HEADER)
                upstream = _HttpUpstream(client, upstream_url, request.headers, pending)
                run = f"mcp-session:{session}" if session else process_run
                answer = await calls.handle(msg, upstream, run)
                return web.Response(body=encode(answer), content_type="application/json")
            if isinstance(msg, list) and any(calls.is_write_call(m) for m in msg):
                refusal = "effect-ledger: send a write tool call on its own, not in a batch"
                return web.json_response(error_response(None, INVALID_REQUEST, refusal), status=400)
        return await _forward(request, body)

    async def _forward(request: web.Request, body: bytes) -> web.StreamResponse:
        headers = _forwardable(request.headers)
        resp: web.StreamResponse | None = None
        try:
            async with client.request(
                request.method, origin + request.path_qs, headers=headers, data=body or None, allow_redirects=False
            ) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason, headers=_forwardable(up.headers))
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as e:
            if resp is not None:  # the stream broke midway: end it; the client sees it end
                return resp
            return web.json_response(error_response(None, -32603, f"effect-ledger: upstream: {e}"), status=502)

    app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        print(f"effects mcp-proxy: listening on http://{host}:{bound}{endpoint} -> {upstream_url}", file=sys.stderr)
        sys.stderr.flush()
        await stop.wait()
    finally:
        await runner.cleanup()
        await client.close()
