"""``SyncLedger`` in Kafka mode against the real broker: ``sync=True`` means the intent is on
``effects.events`` before the destination is called, and everything the file holds is relayed by the
time the ledger is closed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from effect_ledger import SyncLedger
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Intent
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.integration.test_sdk_kafka import consume_all, event_ids, unsent_rows
from tests.sdk_contract import DECLARED


def on_kafka(cfg: KafkaConfig) -> list[Any]:
    codec = default_codec()
    return [codec.decode(msg.value()) for msg in consume_all(cfg, cfg.topics.events)]


def test_sync_ledger_in_kafka_mode_relays_every_event(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    seen_at_call: list[list[Any]] = []

    def refund(key: str) -> dict[str, Any]:
        # sync=True: the broker acknowledged the intent before this call started.
        seen_at_call.append(on_kafka(kafka_config))
        return {"id": f"re_{key[-6:]}"}

    with SyncLedger.open(path, kafka=kafka_config, sync=True, targets=DECLARED) as ledger:
        assert ledger.ledger.relay is not None
        results = [
            ledger.execute(
                target="payments",
                operation="refund.create",
                run_id="run-k",
                step=f"refund-{i}",
                request={"order": str(i), "amount": 100 + i},
                call=refund,
                timeout=30,
            )  # fmt: skip
            for i in range(3)
        ]
        assert all(c.called for c in results)
        # The same key again: the recorded receipt, nothing new written.
        again = ledger.execute(
            target="payments", operation="refund.create", run_id="run-k", step="refund-0",
            request={"order": "0", "amount": 100}, call=refund, timeout=30,
        )  # fmt: skip
        assert not again.called and len(seen_at_call) == 3

    first = effect_key("payments", "refund.create", "run-k", "refund-0")
    intents = [e for e in seen_at_call[0] if isinstance(e, Intent)]
    assert [(i.effect_id, i.attempt) for i in intents] == [(first, 1)]
    assert unsent_rows(path) == []  # close drained the outbox
    written = event_ids(path)
    assert len(written) == 9  # intent, executed, receipt per effect
    relayed = [e.event_id for e in on_kafka(kafka_config)]
    assert sorted(relayed) == sorted(written)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT state, COUNT(*) FROM effects GROUP BY state").fetchall() == [("CONFIRMED", 3)]
