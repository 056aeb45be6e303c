"""The key rule of effect_ledger.openai_agents against the real SDK (Agent, Runner, the SDK's own
ScriptedModel), in process: the key comes from the run, never from the model's tool_call_id."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunConfig, Runner, UserError
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from effect_ledger import EffectConflict, InvalidEffect, Ledger, Target, effect_key
from effect_ledger.openai_agents import ledger_tool

CONFIG = RunConfig(tracing_disabled=True)


def with_ledger(tmp_path: Path, body: Callable[[Ledger], Awaitable[None]]) -> None:
    async def go() -> None:
        async with await Ledger.open(
            str(tmp_path / "effects.db"), targets=[Target("payments", honours_keys=True)]
        ) as lg:
            await body(lg)

    asyncio.run(go())


def refund_tool(ledger: Ledger, sent: list[str], **options: Any) -> FunctionTool:
    @ledger_tool(ledger, target="payments", operation="refund.create", **options)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        sent.append(idempotency_key)
        return {"id": f"re_{len(sent)}", "order": order}

    return refund


def calls(*call_ids_and_orders: tuple[str, str]) -> ScriptedModel:
    """A model that calls refund once per (call id, order), one turn each, then answers."""
    steps: list[Any] = [
        ModelStep(output=[function_call("refund", {"order": o, "amount": 100}, call_id=c)])
        for c, o in call_ids_and_orders
    ]
    return ScriptedModel([*steps, ModelStep(output=[assistant_message("done")])])


async def run(tool: FunctionTool, model: ScriptedModel, context: Any) -> Any:
    agent = Agent(name="support", model=model, tools=[tool])
    return await Runner.run(agent, "refund", context=context, run_config=CONFIG)


def test_the_model_never_sees_the_key(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        tool = refund_tool(ledger, [])
        assert tool.name == "refund"
        assert set(tool.params_json_schema["properties"]) == {"order", "amount"}

    with_ledger(tmp_path, body)


def test_same_run_same_step_is_one_key_across_turns_and_call_ids(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent)
        await run(tool, calls(("call_a", "123"), ("call_b", "123")), {"run_id": "conv-1"})
        await run(tool, calls(("call_c", "123")), {"run_id": "conv-1"})  # a later run of the same conversation
        key = effect_key("payments", "refund.create", "conv-1", "refund")
        assert sent == [key]  # three tool calls with three call ids: one write
        effect = await ledger.get(key)
        assert effect is not None and effect.intent.run_id == "conv-1" and effect.intent.step == "refund"

    with_ledger(tmp_path, body)


def test_different_runs_get_different_keys(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent)
        await run(tool, calls(("call_a", "123")), {"run_id": "conv-1"})
        await run(tool, calls(("call_a", "123")), {"run_id": "conv-2"})  # the same call id in another run
        assert sent == [effect_key("payments", "refund.create", r, "refund") for r in ("conv-1", "conv-2")]

    with_ledger(tmp_path, body)


def test_a_step_function_names_each_write(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent, step=lambda args: f"order-{args['order']}")
        await run(tool, calls(("call_a", "123"), ("call_b", "456"), ("call_c", "123")), {"run_id": "conv-1"})
        assert sent == [effect_key("payments", "refund.create", "conv-1", f"order-{o}") for o in ("123", "456")]

    with_ledger(tmp_path, body)


def test_another_request_for_the_same_step_is_a_conflict(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        tool = refund_tool(ledger, sent)
        with pytest.raises(UserError) as raised:  # the SDK wraps what a tool raises; the cause is ours
            await run(tool, calls(("call_a", "123"), ("call_b", "456")), {"run_id": "conv-1"})
        assert isinstance(raised.value.__cause__, EffectConflict)
        assert len(sent) == 1

    with_ledger(tmp_path, body)


def test_a_run_without_a_run_id_is_refused(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        sent: list[str] = []
        with pytest.raises(UserError) as raised:
            await run(refund_tool(ledger, sent), calls(("call_a", "123")), None)
        assert isinstance(raised.value.__cause__, InvalidEffect) and "run_id" in str(raised.value.__cause__)
        assert sent == []

    with_ledger(tmp_path, body)


def test_needs_approval_is_the_ledgers(tmp_path: Path) -> None:
    async def body(ledger: Ledger) -> None:
        with pytest.raises(InvalidEffect, match="needs_approval"):
            refund_tool(ledger, [], needs_approval=True)

    with_ledger(tmp_path, body)
