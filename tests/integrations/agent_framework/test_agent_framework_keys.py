"""The key rule of effect_ledger.agent_framework against real Agent Framework agents and workflows,
in process: a superstep replayed from its checkpoint keeps the key, other runs get other keys, a run
without a run id stops fail-closed, and the model never sees the key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, FileCheckpointStorage, MiddlewareFailure

from effect_ledger import EffectUncertain, InvalidEffect, State, SyncLedger, Target, effect_key
from effect_ledger.agent_framework import ledger_tool, record
from effect_ledger.demo.agent import payments_target
from effect_ledger.demo.gateway import Gateway
from effect_ledger.integrations.decisions import escalation
from tests.integrations.agent_framework.app import NAME, RefundModel, build
from tests.integrations.gateway_http import post_refund
from tests.sdk_contract import FakeClock


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    with Gateway("lookup") as gw:  # does not dedupe keys: a second call would be a second refund
        yield gw


@pytest.fixture
def ledger(tmp_path: Path, gateway: Gateway) -> Iterator[SyncLedger]:
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=[payments_target(gateway.url, "lookup")]) as led:
        yield led


def test_a_superstep_replayed_from_its_checkpoint_keeps_the_key(
    ledger: SyncLedger, gateway: Gateway, tmp_path: Path
) -> None:
    storage = FileCheckpointStorage(str(tmp_path / "checkpoints"))

    async def go() -> list[Any]:
        wf = build(ledger, gateway.url, False, storage)
        first = await wf.run("Refund order 123.", function_invocation_kwargs={"run_id": "r-1"})
        # Every checkpoint of the run, the one before the agent's superstep included: replay each.
        replays = []
        for cp in await storage.list_checkpoints(workflow_name=NAME):
            again = build(ledger, gateway.url, False, storage)
            replays.append(
                await again.run(checkpoint_id=cp.checkpoint_id, function_invocation_kwargs={"run_id": "r-1"})
            )
        other = await build(ledger, gateway.url, False, storage).run(
            "Refund order 123.", function_invocation_kwargs={"run_id": "r-2"}
        )
        return [first, *replays, other]

    results = asyncio.run(go())
    assert len(results) >= 3  # at least one replay
    made = gateway.refunds()
    assert [r.idempotency_key for r in made] == [
        effect_key("payments", "refund.create", run, "refund") for run in ("r-1", "r-2")
    ]
    outputs = [r.get_outputs() for r in results]
    assert all(o in ([made[0].id], []) for o in outputs[:-1]) and outputs[0] == [made[0].id]
    assert outputs[-1] == [made[1].id]


def test_a_step_from_the_request_names_each_write(ledger: SyncLedger, gateway: Gateway) -> None:
    @ledger_tool(ledger, target="payments", operation="refund.create", step=lambda r: f"order-{r['order']}")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        return post_refund(gateway.url, order, amount, idempotency_key)

    agent = Agent(client=RefundModel(), name="refunds", tools=[refund])
    reply = asyncio.run(agent.run("Refund order 123.", function_invocation_kwargs={"run_id": "r-1"}))
    [made] = gateway.refunds()
    assert reply.text == made.id
    assert made.idempotency_key == effect_key("payments", "refund.create", "r-1", "order-123")


def test_the_model_sees_no_key_and_no_context(ledger: SyncLedger) -> None:
    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        raise AssertionError("not called")

    assert set(refund.parameters()["properties"]) == {"order", "amount"}
    assert refund.name == "refund" and refund.description == "Refund an order."


def test_a_run_without_a_run_id_stops_fail_closed(ledger: SyncLedger, gateway: Gateway) -> None:
    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        raise AssertionError("not called")

    agent = Agent(client=RefundModel(), name="refunds", tools=[refund])
    with pytest.raises(MiddlewareFailure) as failed:
        asyncio.run(agent.run("Refund order 123."))
    assert isinstance(failed.value.__cause__, InvalidEffect) and "run id" in str(failed.value.__cause__)
    assert gateway.refunds() == []


def test_an_answer_about_an_earlier_attempt_decides_nothing(tmp_path: Path) -> None:
    """Escalated, decided absent, made again, escalated again: the first request's answer, sent again,
    must not decide the second escalation (it could send the refund a third time)."""
    nobody = Target("payments", honours_keys=False)  # nobody can ask it: an unknown outcome escalates
    clock = FakeClock()

    def lost_reply(key: str) -> Any:
        raise ConnectionError("connection reset")  # may or may not have been made

    with SyncLedger.open(str(tmp_path / "effects.db"), targets=[nobody], clock=clock) as ledger:

        def escalate() -> dict[str, Any]:
            for _ in range(2):  # the lost reply, then the reconciliation that finds nobody to ask
                with pytest.raises(EffectUncertain) as e:
                    ledger.execute(target="payments", operation="refund.create", request={"o": 1},
                                   call=lost_reply, run_id="r-1", step="refund")  # fmt: skip
            effect = ledger.get(e.value.effect_id)
            assert effect is not None and effect.state is State.ESCALATED
            return escalation(effect, e.value.reason)

        first = escalate()
        clock.advance(60_000)  # "absent" is refused while attempt 1 could still land
        record(ledger, first, {"decision": "absent", "by": "bob", "reason": "not seen"})
        second = escalate()
        assert (first["attempt"], second["attempt"]) == (1, 2)
        with pytest.raises(InvalidEffect, match="attempt 1"):
            record(ledger, first, {"decision": "absent", "by": "bob", "reason": "not seen"})
        effect = ledger.get(second["effect_id"])
        assert effect is not None and (effect.state, effect.attempt) == (State.ESCALATED, 2)
