"""A real MCP server (the ``mcp`` package's low-level ``Server``) for the proxy's tests.

Tools: ``refund`` (a write: every execution is counted in a JSON state file), ``find_refund`` (a
lookup by idempotency key) and ``balance`` (a read). One resource and one prompt, so pass-through
can be checked. Configured by the environment, so a restarted server keeps its state:

* ``MCP_TEST_STATE``: the state file (executions, calls, lookups, refunds by key)
* ``MCP_TEST_HONOURS_KEYS=1``: a call whose ``_meta.idempotencyKey`` was seen returns the first
  result instead of executing again (like an HTTP API honouring ``Idempotency-Key``)
* ``MCP_TEST_HTTP_PORT``: serve streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

STATE = Path(os.environ["MCP_TEST_STATE"])
HONOURS = os.environ.get("MCP_TEST_HONOURS_KEYS") == "1"


def _load() -> dict[str, Any]:
    if STATE.exists():
        return json.loads(STATE.read_text())
    return {"executions": 0, "calls": 0, "lookups": 0, "refunds": {}}


def _save(state: dict[str, Any]) -> None:
    tmp = STATE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, STATE)  # a killed server never leaves half a file


def _text(value: Any, *, error: bool = False, structured: Any = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(value))],
        structured_content=structured,
        is_error=error,
    )


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    obj = {"type": "object"}
    return types.ListToolsResult(
        tools=[
            types.Tool(name="refund", description="refund an order (a write)", input_schema=obj),
            types.Tool(name="find_refund", description="find a refund by idempotency key", input_schema=obj),
            types.Tool(name="balance", description="read an order's balance", input_schema=obj),
        ]
    )


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    state = _load()
    args = params.arguments or {}
    meta = dict(params.meta or {})
    if params.name == "balance":
        return _text({"order": args.get("order"), "balance": 4800})
    if params.name == "find_refund":
        state["lookups"] += 1
        _save(state)
        found = state["refunds"].get(str(args.get("idempotencyKey")))
        if found is None:
            return _text({"found": False}, structured={"found": False})
        return _text(found, structured={"found": True, "id": found["refund_id"], "record": found})
    if params.name != "refund":
        return _text(f"unknown tool {params.name}", error=True)
    state["calls"] += 1
    key = meta.get("idempotencyKey")
    if HONOURS and key in state["refunds"]:
        _save(state)
        return _text(state["refunds"][key], structured=state["refunds"][key])
    if args.get("amount", 0) <= 0:
        _save(state)
        return _text("amount must be positive", error=True)
    state["executions"] += 1
    record = {"refund_id": f"rf_{state['executions']}", "order": args.get("order"), "amount": args.get("amount")}
    if key is not None:
        state["refunds"][key] = record
    _save(state)
    return _text(record, structured=record)


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(name="policy", uri="test://policy")])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    text = types.TextResourceContents(uri=params.uri, text="refunds within 30 days")
    return types.ReadResourceResult(contents=[text])


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(name="apologise")])


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    msg = types.PromptMessage(role="user", content=types.TextContent(type="text", text="Say sorry for the delay."))
    return types.GetPromptResult(messages=[msg])


server = Server(
    "refund-test-server",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_read_resource=read_resource,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
)


async def _stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main() -> None:
    port = os.environ.get("MCP_TEST_HTTP_PORT")
    if port:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(port), log_level="warning")
    else:
        anyio.run(_stdio)


if __name__ == "__main__":
    sys.exit(main())
