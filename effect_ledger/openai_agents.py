"""effect-ledger for OpenAI Agents SDK function tools (needs the ``[openai-agents]`` extra).

    from effect_ledger.openai_agents import ledger_tool

The key rule and the approval contract: ``effect_ledger.integrations.openai_agents``.
"""

from __future__ import annotations

from effect_ledger.integrations.openai_agents import decide, escalation, ledger_tool, run_identity

__all__ = ["ledger_tool", "run_identity", "escalation", "decide"]
