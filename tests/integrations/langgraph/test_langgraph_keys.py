"""The key rule of effect_ledger.langgraph against real LangGraph graphs (in process, checkpointed in
a real SQLite file), and the guard against a resume value answering a later escalation."""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.types import Command, Send

from effect_ledger import EffectUncertain, InvalidEffect, State, SyncLedger, Target, effect_key
from effect_ledger.langgraph import execute, node_path, run_identity
from tests.sdk_contract import FakeClock


class S(TypedDict, total=False):
    seen: Annotated[list[Any], operator.add]


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


def cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def test_node_path_drops_task_ids() -> None:
    assert node_path("refund:1f0c2a") == "refund"
    assert node_path("billing:1f0c2a|refund:a3c9") == "billing|refund"
    assert node_path("") == ""


def test_key_parts_in_a_subgraph_node_and_with_a_step(saver: SqliteSaver) -> None:
    def refund(state: S) -> S:
        return {"seen": [list(run_identity()), list(run_identity("order-9"))]}

    inner = StateGraph(S)
    inner.add_node("refund", refund)
    inner.add_edge(START, "refund")
    outer = StateGraph(S)
    outer.add_node("billing", inner.compile())
    outer.add_edge(START, "billing")
    out = outer.compile(checkpointer=saver).invoke({"seen": []}, cfg("t-1"))
    assert out["seen"] == [["t-1", "billing|refund"], ["t-1", "order-9"]]


def test_a_node_started_by_send_must_name_its_write(saver: SqliteSaver) -> None:
    def fan_out(state: S) -> list[Send]:
        return [Send("refund", {"seen": [o]}) for o in ("a", "b")]

    def refund(state: S) -> S:
        return {"seen": [run_identity()]}

    g = StateGraph(S)
    g.add_node("refund", refund)
    g.add_conditional_edges(START, fan_out, ["refund"])
    with pytest.raises(InvalidEffect, match="started by Send"):
        g.compile(checkpointer=saver).invoke({"seen": []}, cfg("t-2"))


def test_outside_a_graph_is_refused() -> None:
    with pytest.raises(InvalidEffect, match="outside a LangGraph node"):
        run_identity()


def test_a_resume_value_never_answers_a_later_escalation(saver: SqliteSaver, tmp_path: Path) -> None:
    """Decided absent, executed again, outcome unknown again, escalated again: LangGraph hands the
    old resume value back to the node, and it must not send the refund a third time."""
    calls: list[str] = []
    nobody = Target("payments", honours_keys=False)  # nobody can ask it: an unknown outcome escalates

    def lost_reply(key: str) -> Any:
        calls.append(key)
        raise ConnectionError("connection reset")  # may or may not have been made

    clock = FakeClock()
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=[nobody], clock=clock) as ledger:

        def refund(state: S) -> S:
            c = execute(ledger, target="payments", operation="refund.create", request={"o": 1}, call=lost_reply)
            return {"seen": [c.receipt_id]}

        g = StateGraph(S)
        g.add_node("refund", refund)
        g.add_edge(START, "refund")
        graph = g.compile(checkpointer=saver)
        key = effect_key("payments", "refund.create", "t-3", "refund")

        with pytest.raises(EffectUncertain):  # attempt 1: the reply was lost
            graph.invoke({"seen": []}, cfg("t-3"))
        asked = graph.invoke(None, cfg("t-3"))["__interrupt__"][0].value  # reconciled: nobody to ask
        assert (asked["effect_id"], asked["attempt"]) == (key, 1)
        clock.advance(60_000)  # "absent" is refused while attempt 1 could still land: after its deadline
        with pytest.raises(EffectUncertain):  # decided absent -> attempt 2, its reply lost too
            graph.invoke(Command(resume={"decision": "absent", "by": "bob", "reason": "not seen"}), cfg("t-3"))
        assert calls == [key, key]
        with pytest.raises(EffectUncertain, match="escalated again"):
            graph.invoke(None, cfg("t-3"))
        assert calls == [key, key]  # not a third time on the old answer
        effect = ledger.get(key)
        assert effect is not None and (effect.state, effect.attempt) == (State.ESCALATED, 2)
