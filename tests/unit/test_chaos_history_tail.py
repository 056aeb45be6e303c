"""The chaos run waits after each heal until every steady agent host has completed a call started
since (``tests.chaos.check.HistoryTail``), so that a slow recovery is not counted as the next
fault's unavailability. The tail reads only what was appended, and pairs results with their
invocations as the checker does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.chaos.check import HistoryTail


def _line(**r: Any) -> bytes:
    return (json.dumps(r) + "\n").encode()


def test_recovery_needs_a_call_started_after_the_heal_completed_on_every_host(tmp_path: Path) -> None:
    a, b = tmp_path / "history-a.jsonl", tmp_path / "history-b.jsonl"
    tail = HistoryTail({"a": a, "b": b})
    tail.poll()  # no file yet
    assert not tail.recovered_since(10.0)
    with a.open("ab") as f:
        f.write(_line(t=9.0, host="a", op="invoke", key="k1", target="keyed", amount=1))
        f.write(_line(t=11.0, host="a", op="ok", key="k1", receipt="re_1", amount=1, called=True))
        f.write(_line(t=10.5, host="a", op="invoke", key="k2", target="keyed", amount=1))
        f.write(_line(t=12.0, host="a", op="fail", key="k2", error="LedgerUnavailable"))
    tail.poll()
    # k1 completed after the heal but was started before it; k2 started after, but failed
    assert not tail.recovered_since(10.0)
    with a.open("ab") as f:
        f.write(_line(t=12.5, host="a", op="invoke", key="k3", target="keyed", amount=1))
        f.write(b'{"t": 13.0, "host": "a", "op": "ok", "ke')  # a line still being written
    tail.poll()
    assert not tail.recovered_since(10.0)
    with a.open("ab") as f:
        f.write(b'y": "k3", "receipt": "re_3", "amount": 1, "called": true}\n')
    with b.open("ab") as f:  # on a racing key, the conflict the loser must get is an answer
        f.write(_line(t=10.2, host="b", op="invoke", key="race.7", target="keyed", amount=2))
        f.write(_line(t=10.9, host="b", op="fail", key="race.7", error="EffectConflict"))
    tail.poll()
    assert tail.recovered_since(10.0)
    assert not tail.recovered_since(12.6)  # a later heal needs later calls
