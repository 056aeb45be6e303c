"""``effects retire`` on Kafka: the retention sweep.

Reads the latest state of every effect from the compacted ``effects.state`` and, for each one due
(``effect_ledger.core.retention.due``), writes a ``Retirement`` command to ``effects.events``,
keyed and partitioned like the key's events. The ledger processor decides for good when the command
reaches it (the effect may have changed since: then nothing happens) and writes the tombstone.
Run it from cron or a systemd timer: retention is off until someone does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer

from effect_ledger.core.model import EffectState, Retirement
from effect_ledger.core.retention import due
from effect_ledger.ops.sources import SourceError, latest_states
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.sdk.ledger import new_event_id
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig


def due_states(states: dict[str, EffectState], now_ms: int, after_ms: int) -> list[EffectState]:
    return sorted(
        (s for s in states.values() if due(s.state, s.updated_ms, now_ms, after_ms)), key=lambda s: s.updated_ms
    )


def sweep(
    cfg: KafkaConfig,
    after_ms: int,
    by: str,
    *,
    now_ms: int | None = None,
    dry_run: bool = False,
    timeout_s: float = 30.0,
    progress: Callable[[int], None] | None = None,
) -> list[EffectState]:
    """Write a retirement command for every effect due; returns their states (with ``dry_run``,
    only lists them). ``SourceError`` (one line) when the broker does not acknowledge them."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    found = due_states(latest_states(cfg), now, after_ms)
    if dry_run or not found:
        return found
    codec = default_codec()
    producer = Producer(producer_config(cfg, **{"message.timeout.ms": int(timeout_s * 1000)}))
    errors: list[str] = []

    def report(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(str(err))

    topic = cfg.topics.events
    for s in found:
        cmd = Retirement(new_event_id(), s.effect_id, now, s.version, after_ms, by)
        producer.produce(
            topic, key=s.effect_id.encode(), value=codec.encode(cmd), headers=[codec.header(cmd)], on_delivery=report
        )
        producer.poll(0)
    left = producer.flush(timeout_s)
    if left or errors:
        why = errors[0] if errors else f"{left} not acknowledged within {timeout_s:g} s"
        raise SourceError(f"retirement commands not all written to {topic}: {why}")
    if progress is not None:
        progress(len(found))
    return found


__all__ = ["sweep", "due_states"]
