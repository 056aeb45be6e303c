"""A refund workflow on DBOS (SQLite system database), run as a child process so it can be killed
for real (``EFFECT_LEDGER_CRASH``):

    python -m tests.integrations.dbos.app --workdir DIR --gateway URL --kind lookup --workflow wf-1 start
    ... recover      # launch DBOS again: it recovers the pending workflow; wait for its result
    ... escalation   # recover, print the escalation the workflow publishes, exit while it waits
    ... decide JSON  # recover, send a person's decision, wait for the result

Effects in DIR/effects.db, DBOS's system database in DIR/dbos.sqlite. Prints one JSON line: the
workflow's status and result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from effect_ledger import EffectClosed, SyncLedger
from effect_ledger.dbos import ESCALATION_EVENT, ledger_step, send_decision, with_decisions
from effect_ledger.demo.agent import write_declaration
from tests.integrations.gateway_http import post_refund


def register(ledger: SyncLedger, gateway: str) -> Any:
    """The step and the workflow; registered the same way in every process, before DBOS launches."""

    @DBOS.step()
    @ledger_step(ledger, target="payments", operation="refund.create", timeout=2.0)
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        return post_refund(gateway, order, amount, idempotency_key)

    @DBOS.workflow()
    def refund_order(order: str, amount: int) -> dict[str, Any]:
        try:
            c = with_decisions(ledger, lambda: refund(order, amount), wait_s=120)
        except EffectClosed:
            return {"refund_id": None, "abandoned": True}
        return {"refund_id": c.receipt_id, "called": c.called, "key": c.effect_id}

    return refund_order


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True)
    p.add_argument("--gateway", required=True)
    p.add_argument("--kind", required=True)
    p.add_argument("--workflow", required=True)
    p.add_argument("action", choices=("start", "recover", "escalation", "decide"))
    p.add_argument("decision", nargs="?")
    args = p.parse_args(argv)
    work = Path(args.workdir)
    targets = write_declaration(work / "targets.toml", args.gateway, args.kind)
    with SyncLedger.open(str(work / "effects.db"), targets=str(targets)) as ledger:
        workflow = register(ledger, args.gateway)
        DBOS(config={"name": "effect-ledger-refunds", "system_database_url": f"sqlite:///{work / 'dbos.sqlite'}"})
        DBOS.launch()  # recovers the workflows this executor left pending
        try:
            if args.action == "start":
                with SetWorkflowID(args.workflow):
                    handle = DBOS.start_workflow(workflow, "123", 4800)
            else:
                handle = DBOS.retrieve_workflow(args.workflow)
            if args.action == "escalation":
                asked = DBOS.get_event(args.workflow, ESCALATION_EVENT, timeout_seconds=60)
                print(json.dumps({"escalation": asked}), flush=True)
                os._exit(0)  # the workflow waits for a person; this worker goes away meanwhile
            if args.action == "decide":
                send_decision(args.workflow, json.loads(args.decision))
            result = handle.get_result()
            status = handle.get_status().status
        finally:
            DBOS.destroy()
    print(json.dumps({"status": status, "result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
