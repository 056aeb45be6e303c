"""effect-ledger for Pydantic AI tools (needs the ``[pydantic-ai]`` extra).

    from effect_ledger.pydantic_ai import ledger_tool

The key rule and the deferred-approval contract: ``effect_ledger.integrations.pydantic_ai``.
"""

from __future__ import annotations

from effect_ledger.integrations.pydantic_ai import decide, ledger_tool, run_identity

__all__ = ["ledger_tool", "run_identity", "decide"]
