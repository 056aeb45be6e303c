"""The keys of encrypted request bodies on Kafka: the compacted ``effects.keys`` topic.

In Kafka mode every agent seals bodies (``effect_ledger.sdk.erasure``) under keys kept in one
place, so that one ``effects erase --subject S`` reaches every copy of the subject's bodies, whichever
host wrote them, and any reader allowed to read the topic can open them. A record is keyed by the
key id (random, it says nothing of the subject) and holds ``{"subject_digest", "key", "created_ms"}``;
erasing writes a tombstone per key id. The topic is compacted with hourly segments and a one-hour
``delete.retention.ms`` (``admin.KEYS_TOPIC_CONFIG``): an erased key is gone from the brokers' disks
once the cleaner has run over the closed segment, within a few hours. Restrict the topic with ACLs
(agents write, reconcilers and operators read): it holds keys.

A process reads the topic once (from the start to the high watermarks) and keeps the keys in memory
(about 100 bytes per subject); it reads it again for a key id it does not know (made by another
host since). A process that already holds an erased key keeps it until it restarts: erase, then
restart the long-running readers (or give them a short life) when that matters.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time

from effect_ledger.errors import InvalidEffect, LedgerUnavailable
from effect_ledger.sdk.erasure import subject_digest
from effect_ledger.streams.acl import client_group
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.watermarks import watermarks


class KafkaKeyring:
    """``erasure.Keyring`` on the ``effects.keys`` topic (needs the ``[kafka]`` extra)."""

    def __init__(self, cfg: KafkaConfig, timeout_s: float = 30.0) -> None:
        self.cfg = cfg
        self.topic = cfg.topics.keys
        self.timeout_s = timeout_s
        self._keys: dict[str, tuple[str, bytes]] | None = None  # kid -> (subject digest, key)
        self._lock = asyncio.Lock()

    async def key_for(self, subject: str, now_ms: int) -> tuple[str, bytes]:
        sd = subject_digest(subject)
        async with self._lock:
            keys = await self._loaded()
            kid = min((k for k, (s, _) in keys.items() if s == sd), default=None)
            if kid is not None:
                return kid, keys[kid][1]
            kid, key = os.urandom(16).hex(), os.urandom(32)
            value = json.dumps(
                {"subject_digest": sd, "key": base64.b64encode(key).decode(), "created_ms": now_ms}, sort_keys=True
            ).encode()
            # Written (acknowledged by every in-sync replica) before any body is sealed with it.
            await asyncio.to_thread(self._produce, [(kid, value)])
            keys[kid] = (sd, key)
            return kid, key

    async def key(self, kid: str) -> bytes | None:
        async with self._lock:
            keys = await self._loaded()
            if kid not in keys:
                self._keys = keys = await asyncio.to_thread(self._read)  # made elsewhere since?
            found = keys.get(kid)
            return None if found is None else found[1]

    async def erase(self, subject: str) -> int:
        if not isinstance(subject, str) or not subject:
            raise InvalidEffect("give the subject to erase, as a non-empty string")
        sd = subject_digest(subject)
        async with self._lock:
            self._keys = keys = await asyncio.to_thread(self._read)
            kids = sorted(k for k, (s, _) in keys.items() if s == sd)
            if kids:
                await asyncio.to_thread(self._produce, [(k, None) for k in kids])
                for k in kids:
                    keys.pop(k, None)
            return len(kids)

    async def close(self) -> None:
        return None

    async def _loaded(self) -> dict[str, tuple[str, bytes]]:
        if self._keys is None:
            self._keys = await asyncio.to_thread(self._read)
        return self._keys

    def _read(self) -> dict[str, tuple[str, bytes]]:
        """Every live key: the topic from its start to the high watermarks seen now."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        c = Consumer(
            self.cfg.confluent(
                **{
                    # Never joins (assign(), no commits); under the prefix for the agent role's ACLs.
                    "group.id": client_group(self.cfg.prefix, "keys"),
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
        )
        try:
            try:
                md = c.list_topics(self.topic, timeout=self.timeout_s)
                t = md.topics.get(self.topic)
                if t is None or t.error is not None or not t.partitions:
                    raise LedgerUnavailable(
                        f"the keys topic {self.topic} does not exist: create it (effects topics create)"
                    )
                ends: dict[int, int] = {}
                assignment = []
                for p in t.partitions:
                    lo, hi = watermarks(c, TopicPartition(self.topic, p), time.monotonic() + self.timeout_s)
                    if hi > lo:
                        ends[p] = hi
                        assignment.append(TopicPartition(self.topic, p, lo))
            except KafkaException as e:
                raise LedgerUnavailable(f"cannot read the keys topic {self.topic}: {e}") from e
            out: dict[str, tuple[str, bytes]] = {}
            if not assignment:
                return out
            c.assign(assignment)
            position = {p: 0 for p in ends}
            deadline = time.monotonic() + self.timeout_s
            while any(position[p] < ends[p] for p in ends):
                if time.monotonic() > deadline:
                    raise LedgerUnavailable(f"could not read the keys topic {self.topic} within {self.timeout_s:g} s")
                for m in c.consume(1000, 0.5):
                    raw_key, part, offset = m.key(), m.partition(), m.offset()
                    if m.error() is not None or part is None or offset is None:
                        continue
                    position[part] = max(position[part], offset + 1)
                    if raw_key is None:
                        continue
                    kid = raw_key.decode("utf-8", "replace")
                    value = m.value()
                    if value is None:
                        out.pop(kid, None)  # erased
                    else:
                        try:
                            d = json.loads(value)
                            out[kid] = (str(d["subject_digest"]), base64.b64decode(d["key"]))
                        except (ValueError, KeyError, TypeError):
                            pass  # not a key record: ignored, never fatal
            return out
        finally:
            c.close()

    def _produce(self, records: list[tuple[str, bytes | None]]) -> None:
        from confluent_kafka import KafkaError, Producer

        from effect_ledger.sdk.kafka.relay import producer_config

        p = Producer(producer_config(self.cfg, **{"message.timeout.ms": int(self.timeout_s * 1000)}))
        errors: list[str] = []

        def report(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        for kid, value in records:
            p.produce(self.topic, key=kid.encode(), value=value, on_delivery=report)
        left = p.flush(self.timeout_s)
        if left or errors:
            why = errors[0] if errors else f"{left} not acknowledged within {self.timeout_s:g} s"
            raise LedgerUnavailable(f"could not write to the keys topic {self.topic}: {why}")


__all__ = ["KafkaKeyring"]
