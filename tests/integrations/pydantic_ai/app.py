"""A refund agent on Pydantic AI, run as a child process so it can be killed for real
(``EFFECT_LEDGER_CRASH``):

    python -m tests.integrations.pydantic_ai.app --workdir DIR --gateway URL --kind lookup --run conv-7 start
    ... resume                       # agent.run on the saved messages: the conversation goes on
    ... decide '{"decision": ...}'   # the person's answer to the deferred call, agent.run resumed
    add --plain to use a plain tool (the gateway gets the model's tool_call_id as its key)

The model is Pydantic AI's own FunctionModel (no API key, no network): it calls ``refund`` until the
conversation holds the refund's result, with a new call id each time, as a real model does. Every
message is saved to DIR/messages.json as the run makes it (``agent.iter``), effects go to
DIR/effects.db. Prints one JSON line: the output, the escalation waiting for a person, the refunds
the tool reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, RunContext, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from effect_ledger import Ledger
from effect_ledger.demo.agent import write_declaration
from effect_ledger.pydantic_ai import decide, ledger_tool
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import post_refund

ASK = "Refund order 123: 48.00 CNY."


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The fake model: the refund's receipt once the conversation holds it (or a person's refusal),
    else call the tool."""
    last = messages[-1]
    if isinstance(last, ModelRequest):
        for part in last.parts:
            if isinstance(part, ToolReturnPart) and isinstance(part.content, dict):  # a receipt, not an error
                return ModelResponse(parts=[TextPart(f"Refunded: {json.dumps(part.content)}")])
            if isinstance(part, ToolReturnPart) and "not done" in str(part.content):  # a person said no
                return ModelResponse(parts=[TextPart(f"Not refunded: {part.content}")])
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "123", "amount": 4800}, tool_call_id=call_id)])


def plain_tool(gateway: str) -> Tool[Any]:
    def refund(ctx: RunContext[Any], order: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        made = post_refund(gateway, order, amount, ctx.tool_call_id or "")
        crashpoints.reached(crashpoints.AFTER_CALL)  # the same point the ledger's own call passes
        return made

    return Tool(refund)


def ledger_refund(ledger: Ledger, gateway: str) -> Tool[Any]:
    @ledger_tool(ledger, target="payments", operation="refund.create", timeout=2.0)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        return post_refund(gateway, order, amount, idempotency_key)

    return refund


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True)
    p.add_argument("--gateway", required=True)
    p.add_argument("--kind", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--plain", action="store_true")
    p.add_argument("action", choices=("start", "resume", "decide"))
    p.add_argument("decision", nargs="?")
    args = p.parse_args(argv)
    work = Path(args.workdir)
    saved = work / "messages.json"
    targets = write_declaration(work / "targets.toml", args.gateway, args.kind)
    async with await Ledger.open(str(work / "effects.db"), targets=str(targets)) as ledger:
        tool = plain_tool(args.gateway) if args.plain else ledger_refund(ledger, args.gateway)
        agent = Agent(FunctionModel(answer), tools=[tool], output_type=[str, DeferredToolRequests])
        history = ModelMessagesTypeAdapter.validate_json(saved.read_bytes()) if saved.exists() else None
        results = None
        if args.action == "decide":
            assert history is not None
            asked = json.loads((work / "deferred.json").read_text())
            requests = DeferredToolRequests(approvals=[ToolCallPart(**c) for c in asked["approvals"]])
            requests.metadata.update(asked["metadata"])
            [call] = requests.approvals
            results = await decide(ledger, requests, {call.tool_call_id: json.loads(args.decision)})
        # conversation_id only at the start: later runs take it from the saved messages.
        prompt, conversation = (ASK, args.run) if args.action == "start" else (None, None)
        async with agent.iter(
            prompt, message_history=history, conversation_id=conversation, deferred_tool_results=results
        ) as run:
            async for _ in run:
                saved.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))
        assert run.result is not None
        output, asked_now = run.result.output, None
        if isinstance(output, DeferredToolRequests):
            [call] = output.approvals
            asked_now = output.metadata[call.tool_call_id]
            deferred = {
                "approvals": [
                    {"tool_name": c.tool_name, "args": c.args, "tool_call_id": c.tool_call_id} for c in output.approvals
                ],
                "metadata": output.metadata,
            }
            (work / "deferred.json").write_text(json.dumps(deferred))
            output = None
        refunds = [
            part.content
            for m in run.result.new_messages()
            if isinstance(m, ModelRequest)
            for part in m.parts
            if isinstance(part, ToolReturnPart) and isinstance(part.content, dict)
        ]
    print(json.dumps({"output": output, "asked": asked_now, "refunds": refunds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
