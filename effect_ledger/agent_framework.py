"""effect-ledger for Microsoft Agent Framework tools and workflows (needs the ``[agent-framework]`` extra).

    from effect_ledger.agent_framework import ledger_step, ledger_tool

The key rule and the approval contract: ``effect_ledger.integrations.agent_framework``.
"""

from __future__ import annotations

from effect_ledger.integrations.agent_framework import (
    ESCALATION,
    RUN_ID,
    RUN_STATE,
    answer,
    ask_person,
    escalation_of,
    ledger_step,
    ledger_tool,
    record,
    run_identity,
    set_run,
)

__all__ = [
    "ledger_tool",
    "run_identity",
    "answer",
    "escalation_of",
    "ledger_step",
    "set_run",
    "ask_person",
    "record",
    "RUN_ID",
    "RUN_STATE",
    "ESCALATION",
]
