"""effect-ledger for LangGraph nodes and tools (needs the ``[langgraph]`` extra).

    from effect_ledger.langgraph import ledger_effect

The key rule and the interrupt/resume contract: ``effect_ledger.integrations.langgraph``.
"""

from __future__ import annotations

from effect_ledger.integrations.langgraph import execute, ledger_effect, node_path, run_identity

__all__ = ["ledger_effect", "execute", "run_identity", "node_path"]
