"""The key rule of effect_ledger.pydantic_ai against real Pydantic AI (an Agent driven by its own
FunctionModel), in process: the key comes from the conversation, never from the model's tool_call_id
or the run's id."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from effect_ledger import EffectConflict, Ledger, Target, effect_key
from effect_ledger.pydantic_ai import ledger_tool


def with_ledger(tmp_path: Path, body: Callable[[Ledger], Awaitable[None]]) -> None:
    async def go() -> None:
        async with await Ledger.open(
            str(tmp_path / "effects.db"), targets=[Target("payments", honours_keys=True)]
        ) as lg:
            await body(lg)

    asyncio.run(go())


def refund_tool(ledger: Ledger, sent: list[str], **options: Any) -> Tool[Any]:
    @ledger_tool(ledger, target="payments", operation="refund.create", **options)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        sent.append(idempotency_key)
        return {"id": f"re_{len(sent)}", "order": order}

    return refund


def calls(*call_ids_and_orders: tuple[str, str]) -> FunctionModel:
    """A model that calls refund once per (call id, order), one turn each, then answers."""
    script = list(call_ids_and_orders)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not script:
            return ModelResponse(parts=[TextPart("done")])
        call_id, order = script.pop(0)
        return ModelResponse(parts=[ToolCallPart("refund", {"order": order, "amount": 100}, tool_call_id=call_id)])

    return FunctionModel(model)


async def run(tool: Tool[Any], model: FunctionModel, conversation: str | None, history: Any = None) -> Any:
    return await Agent(model, tools=[tool]).run("refund", conversation_id=conversation, message_history=history)


def test_the_model_never_sees_the_key(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        tool = refund_tool(ledger, [])
        assert tool.name == "refund" and tool.takes_ctx
        assert set(tool.function_schema.json_schema["properties"]) == {"order", "amount"}

    with_ledger(tmp_path, body)


def test_same_conversation_same_step_is_one_key_across_runs_and_call_ids(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent)
        first = await run(tool, calls(("call_a", "123"), ("call_b", "123")), "conv-1")
        # A later run that continues the saved messages: a new run id, the conversation id they carry.
        later = await run(tool, calls(("call_c", "123")), None, first.all_messages())
        assert later.all_messages()[-1].run_id != first.all_messages()[-1].run_id
        key = effect_key("payments", "refund.create", "conv-1", "refund")
        assert sent == [key]  # three tool calls with three call ids, in two runs: one write
        effect = await ledger.get(key)
        assert effect is not None and (effect.intent.run_id, effect.intent.step) == ("conv-1", "refund")

    with_ledger(tmp_path, body)


def test_different_conversations_get_different_keys(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent)
        await run(tool, calls(("call_a", "123")), "conv-1")
        await run(tool, calls(("call_a", "123")), "conv-2")  # the same call id in another conversation
        assert sent == [effect_key("payments", "refund.create", c, "refund") for c in ("conv-1", "conv-2")]

    with_ledger(tmp_path, body)


def test_a_step_function_names_each_write(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent, step=lambda args: f"order-{args['order']}")
        await run(tool, calls(("call_a", "123"), ("call_b", "456"), ("call_c", "123")), "conv-1")
        assert sent == [effect_key("payments", "refund.create", "conv-1", f"order-{o}") for o in ("123", "456")]

    with_ledger(tmp_path, body)


def test_another_request_for_the_same_step_is_a_conflict(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent)
        with pytest.raises(EffectConflict):
            await run(tool, calls(("call_a", "123"), ("call_b", "456")), "conv-1")
        assert len(sent) == 1

    with_ledger(tmp_path, body)
