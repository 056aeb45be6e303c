"""A refund workflow on Microsoft Agent Framework (an agent whose fake chat client always calls the
refund tool, then a finishing executor), checkpointed in files, run as a child process so it can be
killed for real (``EFFECT_LEDGER_CRASH``):

    python -m tests.integrations.agent_framework.app --workdir DIR --gateway URL --kind lookup --run r-1 start
    ... resume       # workflow.run(checkpoint_id=<latest>): the superstep is replayed from its checkpoint
    ... decide JSON  # from the latest checkpoint, answer the pending approval request with a decision
    --plain          # the same agent with a plain @tool (no effect-ledger): the duplicates it makes

Effects in DIR/effects.db, checkpoints in DIR/checkpoints/. Prints one JSON line: the workflow's
outputs, its final state and the escalations it asks a person about.
"""

from __future__ import annotations

# (The package's __init__ has turned telemetry off before anything here is imported.)
import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_framework import (
    Agent,
    AgentExecutorResponse,
    BaseChatClient,
    ChatResponse,
    Content,
    FileCheckpointStorage,
    FunctionInvocationLayer,
    Message,
    WorkflowBuilder,
    WorkflowContext,
    executor,
    tool,
)

from effect_ledger import DecisionRefused, SyncLedger
from effect_ledger.agent_framework import answer, escalation_of, ledger_tool
from effect_ledger.demo.agent import write_declaration
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import post_refund

NAME = "refund-order"


class RefundModel(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """A chat client that asks for the refund tool, then answers with the receipt id it returned
    (or with what it was told when the call was rejected)."""

    async def _answer(self, messages: Sequence[Message]) -> ChatResponse:
        for m in messages:
            for c in m.contents:
                if c.type == "function_result":
                    result = c.result if isinstance(c.result, str) else json.dumps(c.result)
                    try:
                        text = json.loads(result)["receipt_id"]
                    except (ValueError, KeyError, TypeError):
                        text = f"not refunded: {result}"
                    return ChatResponse(messages=[Message(role="assistant", contents=[text])])
        # A new call id every time, as a real model mints one per turn.
        call = Content.from_function_call(
            call_id=f"call-{uuid.uuid4().hex[:8]}", name="refund", arguments={"order": "123", "amount": 4800}
        )
        return ChatResponse(messages=[Message(role="assistant", contents=[call])])

    def _inner_get_response(  # type: ignore[override]
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        return self._answer(messages)


def refund_tool(ledger: SyncLedger, gateway: str, plain: bool) -> Any:
    if plain:

        @tool(name="refund")
        def plain_refund(order: str, amount: int) -> dict[str, Any]:
            """Refund an order (amount in cents)."""
            made = post_refund(gateway, order, amount, f"attempt-{uuid.uuid4()}")  # a key per attempt
            crashpoints.reached(crashpoints.AFTER_CALL)  # where the ledger's own point is
            return {"receipt_id": made["id"]}

        return plain_refund

    @ledger_tool(ledger, target="payments", operation="refund.create", timeout=2.0)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order (amount in cents)."""
        return post_refund(gateway, order, amount, idempotency_key)

    return refund


def build(ledger: SyncLedger, gateway: str, plain: bool, storage: FileCheckpointStorage) -> Any:
    agent = Agent(client=RefundModel(), name="refunds", instructions="Refund the order.",
                  tools=[refund_tool(ledger, gateway, plain)])  # fmt: skip

    @executor(id="finish")
    async def finish(resp: AgentExecutorResponse, ctx: WorkflowContext[Any, str]) -> None:
        await ctx.yield_output(resp.agent_response.text)

    return (
        WorkflowBuilder(name=NAME, start_executor=agent, checkpoint_storage=storage, output_from=[finish])
        .add_edge(agent, finish)
        .build()
    )


async def run(args: argparse.Namespace, ledger: SyncLedger, storage: FileCheckpointStorage) -> dict[str, Any]:
    workflow = build(ledger, args.gateway, args.plain, storage)
    given = {"run_id": args.run}  # the run id the tools' keys are built from, on every run
    if args.action == "start":
        result = await workflow.run("Refund order 123.", function_invocation_kwargs=given)
    else:
        latest = await storage.get_latest(workflow_name=NAME)
        assert latest is not None, "no checkpoint to go on from"
        if args.action == "resume":
            result = await workflow.run(checkpoint_id=latest.checkpoint_id, function_invocation_kwargs=given)
        else:
            pending = list(latest.pending_request_info_events.values())
            try:
                responses = {e.request_id: answer(ledger, e.data, json.loads(args.decision)) for e in pending}
            except DecisionRefused as e:  # "absent" while the attempt may still land: ask again later
                return {"refused": e.retry_after_ms}
            result = await workflow.run(
                checkpoint_id=latest.checkpoint_id, responses=responses, function_invocation_kwargs=given
            )
    asked = [escalation_of(e.data) for e in result.get_request_info_events()]
    return {"outputs": result.get_outputs(), "state": str(result.get_final_state()), "asked": asked}


def main(argv: list[str] | None = None) -> int:
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
    storage = FileCheckpointStorage(str(work / "checkpoints"))
    with SyncLedger.open(str(work / "effects.db"), targets=str(targets)) as ledger:
        out = asyncio.run(run(args, ledger, storage))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
