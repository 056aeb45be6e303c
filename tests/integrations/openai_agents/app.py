"""A refund agent on the OpenAI Agents SDK, run as a child process so it can be killed for real
(``EFFECT_LEDGER_CRASH``):

    python -m tests.integrations.openai_agents.app --workdir DIR --gateway URL --kind lookup --run conv-7 start
    ... resume                       # Runner.run again on the run's SQLiteSession (its history)
    ... decide '{"decision": ...}'   # RunState from DIR/state.json, the person's answer, Runner.run
    add --plain to use a plain function_tool (the gateway gets the model's tool_call_id as its key)

The model is the SDK's own ScriptedModel (no API key, no network): it calls ``refund`` until the
conversation holds the refund's result, with a new call id each time, as a real model does. The
conversation lives in DIR/sessions.db (SQLiteSession), effects in DIR/effects.db. Prints one JSON
line: the final output, the pending interruption (the escalation shown to a person), the refunds the
tool reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner, RunState, SQLiteSession, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
from agents.testing import function_call as model_calls
from agents.tool_context import ToolContext

from effect_ledger import Ledger
from effect_ledger.demo.agent import write_declaration
from effect_ledger.openai_agents import decide, escalation, ledger_tool
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import post_refund

ASK = "Refund order 123: 48.00 CNY."


def answer(call: ModelCall) -> Any:
    """The fake model: the refund's receipt once the conversation holds it (or a person's refusal),
    else call the tool."""
    for item in reversed(list(call.input)):
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            out = item.get("output")
            text = out if isinstance(out, str) else json.dumps(out)
            if "re_" in text:  # the gateway's refund id: the refund's result is in the conversation
                return [assistant_message(f"Refunded: {text}")]
            if "not done" in text:  # a person turned the call down: do not ask again
                return [assistant_message(f"Not refunded: {text}")]
            break
    return [model_calls("refund", {"order": "123", "amount": 4800}, call_id=f"call_{uuid.uuid4().hex[:12]}")]


def fake_model() -> ScriptedModel:
    return ScriptedModel([ModelStep.respond(answer) for _ in range(8)])


def plain_tool(gateway: str) -> FunctionTool:
    @function_tool
    def refund(ctx: ToolContext[Any], order: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        made = post_refund(gateway, order, amount, ctx.tool_call_id)
        crashpoints.reached(crashpoints.AFTER_CALL)  # the same point the ledger's own call passes
        return made

    return refund


def ledger_refund(ledger: Ledger, gateway: str) -> FunctionTool:
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
    targets = write_declaration(work / "targets.toml", args.gateway, args.kind)
    context = {"run_id": args.run}
    session = SQLiteSession(args.run, str(work / "sessions.db"))
    config = RunConfig(tracing_disabled=True, group_id=args.run)
    async with await Ledger.open(str(work / "effects.db"), targets=str(targets)) as ledger:
        tool = plain_tool(args.gateway) if args.plain else ledger_refund(ledger, args.gateway)
        agent = Agent(name="support", instructions="Refund what is asked.", model=fake_model(), tools=[tool])
        if args.action == "start":
            result = await Runner.run(agent, ASK, context=context, session=session, run_config=config)
        elif args.action == "resume":  # the conversation goes on from its saved history
            result = await Runner.run(agent, [], context=context, session=session, run_config=config)
        else:
            state = await RunState.from_json(agent, json.loads((work / "state.json").read_text()))
            [item] = state.get_interruptions()
            await decide(tool, state, item, json.loads(args.decision), context)
            result = await Runner.run(agent, state, context=context, session=session, run_config=config)
        asked = None
        if result.interruptions:
            [item] = result.interruptions
            asked = await escalation(tool, item, context)
            (work / "state.json").write_text(json.dumps(result.to_state().to_json()))
        outputs = [
            i.output
            for i in result.new_items
            if getattr(i, "type", None) == "tool_call_output_item" and isinstance(i.output, dict)
        ]
    print(json.dumps({"output": result.final_output, "asked": asked, "refunds": outputs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
