"""effect-ledger for DBOS steps (needs the ``[dbos]`` extra).

    from effect_ledger.dbos import ledger_step

The key rule: ``effect_ledger.processors.integrations.dbos``.
"""

from __future__ import annotations

from effect_ledger.processors.integrations.dbos import ledger_step, run_identity

__all__ = ["ledger_step", "run_identity"]
