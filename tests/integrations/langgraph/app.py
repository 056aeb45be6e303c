"""A refund graph, run as a child process so it can be killed for real (``EFFECT_LEDGER_CRASH``):

    python -m tests.integrations.langgraph.app --workdir DIR --gateway URL --kind lookup --thread t1 start
    ... resume                       # graph.invoke(None): the thread goes on from its checkpoint
    ... decide '{"decision": ...}'   # graph.invoke(Command(resume=...))

START -> refund -> notify -> END, checkpointed in DIR/checkpoints.db (SqliteSaver), effects in
DIR/effects.db. Prints one JSON line: the graph's values, its pending interrupts, its next nodes.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from effect_ledger import EffectClosed, SyncLedger
from effect_ledger.demo.agent import write_declaration
from effect_ledger.langgraph import ledger_effect
from tests.integrations.gateway_http import post_refund


class Refund(TypedDict, total=False):
    order: str
    amount: int
    status: str
    refund_id: str
    called: bool
    notified: bool


def build(ledger: SyncLedger, gateway: str, checkpointer: SqliteSaver) -> Any:
    @ledger_effect(ledger, target="payments", operation="refund.create", timeout=2.0)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        return post_refund(gateway, order, amount, idempotency_key)

    def refund_node(state: Refund) -> Refund:
        try:
            c = refund(state["order"], state["amount"])
        except EffectClosed:  # a person abandoned it: the graph goes on without a refund
            return {"status": "abandoned"}
        return {"status": "refunded", "refund_id": c.receipt_id, "called": c.called}

    def notify(state: Refund) -> Refund:
        return {"notified": True}

    g = StateGraph(Refund)
    g.add_node("refund", refund_node)
    g.add_node("notify", notify)
    g.add_edge(START, "refund")
    g.add_edge("refund", "notify")
    g.add_edge("notify", END)
    return g.compile(checkpointer=checkpointer)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True)
    p.add_argument("--gateway", required=True)
    p.add_argument("--kind", required=True)
    p.add_argument("--thread", required=True)
    p.add_argument("action", choices=("start", "resume", "decide"))
    p.add_argument("decision", nargs="?")
    args = p.parse_args(argv)
    work = Path(args.workdir)
    targets = write_declaration(work / "targets.toml", args.gateway, args.kind)
    config = {"configurable": {"thread_id": args.thread}}
    conn = sqlite3.connect(work / "checkpoints.db", check_same_thread=False)
    with SyncLedger.open(str(work / "effects.db"), targets=str(targets)) as ledger:
        graph = build(ledger, args.gateway, SqliteSaver(conn))
        if args.action == "start":
            graph.invoke({"order": "123", "amount": 4800}, config)
        elif args.action == "resume":
            graph.invoke(None, config)
        else:
            graph.invoke(Command(resume=json.loads(args.decision)), config)
        snap = graph.get_state(config)
        out = {
            "values": snap.values,
            "next": list(snap.next),
            "interrupts": [i.value for i in snap.interrupts],
        }
    conn.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
