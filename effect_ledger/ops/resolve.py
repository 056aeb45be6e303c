"""``effects resolve --db FILE``: a person's decision recorded in an embedded ledger (the Kafka
mode writes to ``effects.decisions``: ``effect_ledger.ops.views.decide``)."""

from __future__ import annotations

import asyncio

from effect_ledger.core.model import DecisionKind, State
from effect_ledger.ops.sources import SourceError
from effect_ledger.ops.views import read_only
from effect_ledger.targets.load import TargetsSpec


def decide_in_file(
    db: str, key: str, kind: DecisionKind, by: str, reason: str, receipt_id: str | None, targets: TargetsSpec = None
) -> State:
    """Record the decision through ``Ledger.decide`` (its refusals are typed ``LedgerError``s); the
    effect's state afterwards. A missing file, one that is not a ledger, or an unknown key is
    refused (``SourceError``) without writing to the file."""
    from effect_ledger.sdk.ledger import Ledger

    read_only(db).close()

    async def go() -> State:
        # The targets say how long a cut-off call may still land (an ABSENT is refused until then).
        async with await Ledger.open(db, targets=targets) as ledger:
            if await ledger.get(key) is None:
                raise SourceError(f"no effect with key {key!r} in {db}")
            effect = await ledger.decide(key, kind, by=by, reason=reason, receipt_id=receipt_id)
            return effect.state

    return asyncio.run(go())
