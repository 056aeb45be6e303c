"""effect-ledger for DBOS steps (needs the ``[dbos]`` extra).

    from effect_ledger.dbos import ledger_step

The key rule and the decision contract: ``effect_ledger.integrations.dbos``.
"""

from __future__ import annotations

from effect_ledger.integrations.dbos import (
    DECISION_TOPIC,
    ESCALATION_EVENT,
    ledger_step,
    run_identity,
    send_decision,
    with_decisions,
)

__all__ = ["ledger_step", "run_identity", "with_decisions", "send_decision", "ESCALATION_EVENT", "DECISION_TOPIC"]
