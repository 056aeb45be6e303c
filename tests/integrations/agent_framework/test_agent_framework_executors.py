"""ledger_step in real Agent Framework workflow executors, in process: a superstep replayed from each
of its checkpoints makes the write once under one key, and an escalation goes to a person through
request_info and comes back through the executor's response handler."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agent_framework import (
    Executor,
    FileCheckpointStorage,
    InMemoryCheckpointStorage,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    response_handler,
)

from effect_ledger import EffectUncertain, InvalidEffect, State, SyncLedger, effect_key
from effect_ledger.agent_framework import ask_person, ledger_step, record, set_run
from effect_ledger.demo.agent import payments_target
from effect_ledger.demo.gateway import Gateway
from tests.integrations.gateway_http import post_refund


def workflow(ledger: SyncLedger, gateway: str, storage: Any) -> Any:
    @ledger_step(ledger, target="payments", operation="refund.create", timeout=1.0)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        return post_refund(gateway, order, amount, idempotency_key)

    class Take(Executor):
        @handler
        async def take(self, order: str, ctx: WorkflowContext[str]) -> None:
            set_run(ctx, f"order-{order}")  # the run's name, kept in the checkpointed state
            await ctx.send_message(order)

    class Pay(Executor):
        @handler
        async def pay(self, order: str, ctx: WorkflowContext[Any, str]) -> None:
            try:
                c = await refund(order, 4800, ctx=ctx)
            except EffectUncertain as e:
                await ask_person(ledger, ctx, e)  # an escalation waits for a person; anything else raises
                return
            await ctx.yield_output(c.receipt_id)

        @response_handler
        async def decided(self, original_request: dict, response: dict, ctx: WorkflowContext[Any, str]) -> None:
            record(ledger, original_request, response)
            c = await refund(original_request["request"]["order"], 4800, ctx=ctx)
            await ctx.yield_output(c.receipt_id)

    take, pay = Take(id="take"), Pay(id="pay")
    return WorkflowBuilder(name="pay", start_executor=take, checkpoint_storage=storage).add_edge(take, pay).build()


def test_a_replayed_superstep_writes_once(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(str(tmp_path / "checkpoints"))
    with (
        Gateway("lookup") as gw,
        SyncLedger.open(str(tmp_path / "effects.db"), targets=[payments_target(gw.url, "lookup")]) as ledger,
    ):

        async def go() -> list[Any]:
            results = [await workflow(ledger, gw.url, storage).run("123")]
            for cp in await storage.list_checkpoints(workflow_name="pay"):
                results.append(await workflow(ledger, gw.url, storage).run(checkpoint_id=cp.checkpoint_id))
            return results

        results = asyncio.run(go())
        assert len(results) >= 3  # the run, then a replay from each checkpoint (before each superstep)
        [made] = gw.refunds()
        assert made.idempotency_key == effect_key("payments", "refund.create", "order-123", "refund")
        assert results[0].get_outputs() == [made.id]
        assert all(r.get_outputs() in ([made.id], []) for r in results[1:])
        assert any(r.get_outputs() == [made.id] for r in results[1:])  # a replay did run the write again


def test_an_escalation_asks_a_person_through_request_info(tmp_path: Path) -> None:
    storage = InMemoryCheckpointStorage()
    with (
        Gateway("none") as gw,
        SyncLedger.open(str(tmp_path / "effects.db"), targets=[payments_target(gw.url, "none")]) as ledger,
    ):
        key = effect_key("payments", "refund.create", "order-123", "refund")

        async def go() -> tuple[Any, Any]:
            gw.state.failures.append(("lost", 0.0))  # the gateway commits, then its reply is lost
            with pytest.raises(Exception) as lost:
                await workflow(ledger, gw.url, storage).run("123")
            assert "uncertain" in repr(lost.value).lower() or isinstance(lost.value, EffectUncertain)
            before_pay = [c for c in await storage.list_checkpoints(workflow_name="pay") if c.iteration_count == 1]
            wf = workflow(ledger, gw.url, storage)
            asked = await wf.run(checkpoint_id=before_pay[0].checkpoint_id)  # replayed: nobody to ask
            [request] = asked.get_request_info_events()
            assert request.data["effect_id"] == key and ledger.get(key).state is State.ESCALATED
            [made] = gw.refunds()
            decision = {"decision": "confirmed", "by": "alice", "reason": "in the dashboard", "receipt_id": made.id}
            return made, await wf.run(responses={request.request_id: decision})

        made, done = asyncio.run(go())
        assert done.get_outputs() == [made.id] and len(gw.refunds()) == 1
        assert ledger.get(key).state is State.CONFIRMED


def test_a_write_outside_a_named_run_is_refused(tmp_path: Path) -> None:
    with (
        Gateway("lookup") as gw,
        SyncLedger.open(str(tmp_path / "effects.db"), targets=[payments_target(gw.url, "lookup")]) as ledger,
    ):

        @ledger_step(ledger, target="payments", operation="refund.create")
        def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
            raise AssertionError("not called")

        with pytest.raises(InvalidEffect, match="set_run"):
            asyncio.run(refund("1", 1))
