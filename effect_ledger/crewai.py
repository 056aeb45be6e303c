"""effect-ledger for CrewAI tools and flows (needs the ``[crewai]`` extra).

    from effect_ledger.crewai import crew_run, ledger_tool

The key rule and the human-feedback contract: ``effect_ledger.integrations.crewai``.
"""

from __future__ import annotations

from effect_ledger.integrations.crewai import (
    ESCALATED,
    EscalationFeedback,
    crew_run,
    escalation_of,
    kickoff,
    ledger_tool,
    record_decision,
    run_identity,
    task_names,
)

__all__ = [
    "ledger_tool",
    "crew_run",
    "kickoff",
    "record_decision",
    "run_identity",
    "task_names",
    "escalation_of",
    "EscalationFeedback",
    "ESCALATED",
]
