"""Every way an effect becomes UNCERTAIN is counted (the SDK's own unknown outcomes included), and a
duplicate execution has its counter: on the embedded ledger file, with real prometheus-client
collectors (``effect_ledger.metrics.effects``), and the pure classification of changes row by row."""

from __future__ import annotations

from pathlib import Path

import pytest

from effect_ledger.core.effect import absorb
from effect_ledger.core.model import Executed, Intent, Outcome, Timeout, TimeoutPhase
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import EffectUncertain
from effect_ledger.metrics.effects import changes
from effect_ledger.metrics.names import LedgerMetrics
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from tests.sdk_contract import Destination, FakeClock, run


def sample(m: LedgerMetrics, name: str, **labels: str) -> float:
    return float(m.registry.get_sample_value(name, labels) or 0.0)


def intent(key: str, attempt: int = 1, at: int = 1_000) -> Intent:
    return Intent(
        f"i{attempt}", key, at, attempt, "payments", "refund", "default", "r", "s", "{}", "d", at + 10_000, "w"
    )


def executed(key: str, attempt: int, outcome: Outcome, at: int = 2_000) -> Executed:
    return Executed(f"x{attempt}{outcome}", key, at, attempt, outcome, None, at - 100, at, None, "w")


def test_changes_name_each_way_into_uncertain_and_each_duplicate() -> None:
    key = "payments:k"
    pending, _ = absorb(None, [intent(key)])
    assert pending is not None
    unknown, _ = absorb(pending, [executed(key, 1, Outcome.UNKNOWN)])
    assert [(c.kind, c.detail) for c in changes(pending, unknown, [executed(key, 1, Outcome.UNKNOWN)])] == [
        ("uncertain", "unknown_outcome")
    ]
    t = Timeout("t1", key, 20_000, 1, TimeoutPhase.CALL, 11_000)
    late, _ = absorb(pending, [t])
    assert [(c.kind, c.detail) for c in changes(pending, late, [t])] == [("uncertain", "deadline")]
    # Already UNCERTAIN: a second reason is not a second count.
    assert changes(late, late, [t]) == []
    # Two attempts that both returned ok: one duplicate execution, flagged once.
    ok1, _ = absorb(pending, [executed(key, 1, Outcome.OK)])
    second, _ = absorb(ok1, [intent(key, 2, 3_000), executed(key, 2, Outcome.OK, 4_000)])
    assert second is not None
    found = changes(ok1, second, [executed(key, 2, Outcome.OK, 4_000)])
    assert [(c.kind, c.detail, c.target, c.operation) for c in found] == [
        ("duplicate", "execution", "payments", "refund")
    ]
    third, _ = absorb(second, [intent(key, 3, 5_000), executed(key, 3, Outcome.OK, 6_000)])
    assert third is not None and changes(second, third, []) == []


def test_the_sdks_unknown_outcome_and_a_second_receipt_are_counted_once(tmp_path: Path) -> None:
    m = LedgerMetrics()
    clock = FakeClock()

    async def main() -> None:
        ledger = await Ledger.open(str(tmp_path / "e.db"), clock=clock, targets=[Target("payments")], metrics=m)
        # The runner shares the registry: the SDK's watch is replaced by the runner's, not doubled.
        Runner(ledger, metrics=m)
        try:
            dest = Destination()
            dest.fail.append(ConnectionError("connection reset"))
            with pytest.raises(EffectUncertain):
                await ledger.execute(
                    target="payments", operation="refund", run_id="r", step="lost", request={}, call=dest
                )
            ok = await ledger.execute(
                target="payments", operation="refund", run_id="r", step="paid", request={}, call=Destination()
            )
            # A webhook reports a second, different receipt for the same key: the destination ran it twice.
            await ledger.record_receipt(ok.effect_id, "re_other", {"id": "re_other"})
            await ledger.record_receipt(ok.effect_id, "re_other", {"id": "re_other"})  # replayed: nothing new
        finally:
            await ledger.close()

    run(main())
    assert sample(m, "effect_ledger_uncertain_total", target="payments", cause="unknown_outcome") == 1
    assert sample(m, "effect_ledger_uncertain_total", target="payments", cause="deadline") == 0
    assert sample(m, "effect_ledger_duplicate_executions_total", target="payments", kind="receipt") == 1
    assert sample(m, "effect_ledger_duplicate_executions_total", target="payments", kind="execution") == 0
