"""The key rule of effect_ledger.crewai against real CrewAI crews, in process: a task retry
(``max_retry_limit``) keeps the key, other runs get other keys, and a tool outside crew_run is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM

from effect_ledger import InvalidEffect, SyncLedger, effect_key
from effect_ledger.crewai import crew_run, ledger_tool, run_identity, task_names
from effect_ledger.demo.agent import payments_target
from effect_ledger.demo.gateway import Gateway
from tests.integrations.crewai.app import RefundModel
from tests.integrations.gateway_http import post_refund


class LostAnswer(RefundModel):
    """Calls the tool, then fails once where it would have answered (a dropped model connection):
    CrewAI retries the whole task, and the model calls the tool again."""

    failed: ClassVar[bool] = False

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        answer = super().call(messages, *args, **kwargs)
        if answer.startswith("Thought: the refund is made") and not LostAnswer.failed:
            LostAnswer.failed = True
            raise ConnectionError("the model's connection dropped")
        return answer


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    with Gateway("lookup") as gw:  # does not dedupe keys: a second call would be a second refund
        yield gw


@pytest.fixture
def ledger(tmp_path: Path, gateway: Gateway) -> Iterator[SyncLedger]:
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=[payments_target(gateway.url, "lookup")]) as led:
        yield led


def crew_with(tool: Any, llm: BaseLLM, task_name: str | None = "refund") -> Crew:
    agent = Agent(role="clerk", goal="refund", backstory="pays refunds", llm=llm, tools=[tool],
                  allow_delegation=False, max_iter=4, max_retry_limit=2, tool_failure_policy="raise")  # fmt: skip
    return Crew(agents=[agent], tasks=[Task(description="Refund order 123", expected_output="an id", agent=agent,
                                            name=task_name)])  # fmt: skip


def test_a_task_retry_keeps_the_key(ledger: SyncLedger, gateway: Gateway) -> None:
    sent: list[str] = []

    @ledger_tool(ledger, target="payments", operation="refund.create", timeout=2.0)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        sent.append(idempotency_key)
        return post_refund(gateway.url, order, amount, idempotency_key)

    LostAnswer.failed = False
    crew = crew_with(refund, LostAnswer(model="fake"))
    with crew_run("r-1", crew):
        out = crew.kickoff()
    assert LostAnswer.failed  # the task did run twice
    [made] = gateway.refunds()
    assert str(out) == made.id
    assert sent == [effect_key("payments", "refund.create", "r-1", "refund|refund")]


def test_the_model_sees_no_key_argument(ledger: SyncLedger) -> None:
    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        raise AssertionError("not called")

    assert set(refund.args_schema.model_json_schema()["properties"]) == {"order", "amount"}
    assert refund.name == "refund" and refund.description.endswith("Refund an order.")


def test_keys_by_run_task_and_step(ledger: SyncLedger, gateway: Gateway) -> None:
    seen: list[tuple[str, str]] = []

    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        seen.append(run_identity("refund"))
        seen.append(run_identity("refund", "order-9"))
        return post_refund(gateway.url, order, amount, idempotency_key)

    for run in ("r-1", "r-1", "r-2"):  # the same run twice (a resumed kickoff: new Task objects, new ids)
        crew = crew_with(refund, RefundModel(model="fake"))
        with crew_run(run, crew):
            crew.kickoff()
    # r-1's second kickoff found its key recorded and did not call the write; r-2 has a key of its own.
    assert seen == [("r-1", "refund|refund"), ("r-1", "order-9"), ("r-2", "refund|refund"), ("r-2", "order-9")]
    assert [r.idempotency_key for r in gateway.refunds()] == [
        effect_key("payments", "refund.create", run, "refund|refund") for run in ("r-1", "r-2")
    ]


def test_a_step_from_the_request_names_each_write(ledger: SyncLedger, gateway: Gateway) -> None:
    @ledger_tool(ledger, target="payments", operation="refund.create", step=lambda r: f"order-{r['order']}")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        return post_refund(gateway.url, order, amount, idempotency_key)

    crew = crew_with(refund, RefundModel(model="fake"))
    with crew_run("r-1", crew):
        crew.kickoff()
    [made] = gateway.refunds()
    assert made.idempotency_key == effect_key("payments", "refund.create", "r-1", "order-123")


def test_unnamed_tasks_are_named_by_their_place() -> None:
    agent = Agent(role="clerk", goal="refund", backstory="b", llm=RefundModel(model="fake"))
    crew = Crew(agents=[agent], tasks=[Task(description=d, expected_output="x", agent=agent) for d in "ab"])
    assert sorted(task_names(crew).values()) == ["task-1", "task-2"]


def test_a_tool_outside_crew_run_is_refused(ledger: SyncLedger) -> None:
    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order."""
        raise AssertionError("not called")

    with pytest.raises(InvalidEffect, match="outside crew_run"):
        refund.run(order="1", amount=1)
    with pytest.raises(InvalidEffect, match="outside crew_run"):
        run_identity("refund")
    assert json.dumps(ledger.get(effect_key("payments", "refund.create", "r", "s")))  # nothing recorded: null
