"""A refund flow on CrewAI (a crew whose fake model always calls the refund tool), persisted with
``@persist`` in SQLite, run as a child process so it can be killed for real (``EFFECT_LEDGER_CRASH``):

    python -m tests.integrations.crewai.app --workdir DIR --gateway URL --kind lookup --run r-1 start
    ... resume       # kickoff(inputs={"id": run}) again: CrewAI restores the saved state, runs the flow
    ... decide JSON  # RefundFlow.from_pending(run).resume(JSON): a person's decision
    --plain          # the same crew with a plain @tool (no effect-ledger): the duplicates it makes

Effects in DIR/effects.db, the flow's state in DIR/flows.db. Prints one JSON line: the flow's state
and, when it paused for a person, the escalation it shows.
"""

from __future__ import annotations

# (The package's __init__ has turned telemetry off before anything here is imported.)
import argparse
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

from crewai import Agent, Crew, Task
from crewai.flow.async_feedback.types import HumanFeedbackPending
from crewai.flow.flow import Flow, listen, start
from crewai.flow.human_feedback import human_feedback
from crewai.flow.persistence import SQLiteFlowPersistence, persist
from crewai.llms.base_llm import BaseLLM
from crewai.tools import tool
from pydantic import BaseModel

from effect_ledger import SyncLedger
from effect_ledger.crewai import EscalationFeedback, escalation_of, kickoff, ledger_tool
from effect_ledger.demo.agent import write_declaration
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import post_refund

RECEIPT = re.compile(r"receipt_id\W+(re_\w+)")


class RefundModel(BaseLLM):
    """A model that calls the refund tool, then answers with the receipt id the tool returned."""

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None, **_: Any) -> str:  # fmt: skip
        text = messages if isinstance(messages, str) else json.dumps(messages)
        seen = RECEIPT.search(text.replace('\\"', '"'))
        if seen:
            return f"Thought: the refund is made\nFinal Answer: {seen.group(1)}"
        return 'Thought: refund it\nAction: refund\nAction Input: {"order": "123", "amount": 4800}'

    def supports_function_calling(self) -> bool:
        return False  # the ReAct text protocol: no provider's tool-call format to imitate


class RefundState(BaseModel):
    id: str = ""
    refund_id: str | None = None
    escalation: dict[str, Any] | None = None


def refund_tool(ledger: SyncLedger, gateway: str, plain: bool) -> Any:
    if plain:

        @tool("refund")
        def plain_refund(order: str, amount: int) -> dict[str, Any]:
            """Refund an order (amount in cents)."""
            made = post_refund(gateway, order, amount, f"attempt-{uuid.uuid4()}")  # a key per attempt
            crashpoints.reached(crashpoints.AFTER_CALL)  # where the ledger's own point is
            return {"receipt_id": made["id"]}

        return plain_refund

    @ledger_tool(ledger, target="payments", operation="refund.create", timeout=1.0)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order (amount in cents)."""
        return post_refund(gateway, order, amount, idempotency_key)

    return refund


def build(ledger: SyncLedger, gateway: str, plain: bool, workdir: Path) -> type[Flow[RefundState]]:
    refund = refund_tool(ledger, gateway, plain)

    def crew() -> Crew:
        agent = Agent(
            role="refunds clerk", goal="refund the order", backstory="pays refunds", llm=RefundModel(model="fake"),
            tools=[refund], allow_delegation=False, max_iter=4, tool_failure_policy="raise",
        )  # fmt: skip
        return Crew(agents=[agent], tasks=[Task(description="Refund order 123", expected_output="a refund id",
                                                agent=agent, name="refund")])  # fmt: skip

    @persist(SQLiteFlowPersistence(str(workdir / "flows.db")))
    class RefundFlow(Flow[RefundState]):
        @start()
        @human_feedback(message="A refund needs a person's decision", provider=EscalationFeedback())
        def pay(self) -> Any:
            out = kickoff(ledger, crew(), self.state.id)
            self.state.escalation = escalation_of(out)
            if self.state.escalation is None:
                self.state.refund_id = str(out)
            return out

        @listen(pay)
        def finish(self) -> None:
            feedback = self.last_human_feedback
            if self.state.escalation is not None and feedback is not None:  # resumed with a decision
                out = kickoff(ledger, crew(), self.state.id, feedback=feedback)
                self.state.escalation = escalation_of(out)
                if self.state.escalation is None:
                    self.state.refund_id = str(out)

    return RefundFlow


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
    with SyncLedger.open(str(work / "effects.db"), targets=str(targets)) as ledger:
        flow_cls = build(ledger, args.gateway, args.plain, work)
        if args.action == "decide":
            flow = flow_cls.from_pending(args.run, SQLiteFlowPersistence(str(work / "flows.db")))
            result = flow.resume(args.decision)
        else:
            flow = flow_cls()
            result = flow.kickoff(inputs={"id": args.run})
        paused = result.callback_info if isinstance(result, HumanFeedbackPending) else None
        out = {"state": flow.state.model_dump(), "paused": paused}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
