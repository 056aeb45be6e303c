"""The high watermark questions of agents and lookups (``claims.Watermarks``) against the real broker:
questions about one partition share round trips, every answer covers what Kafka had acknowledged
when it was asked, and they never wait for the default executor's threads."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from confluent_kafka import Producer

from effect_ledger.sdk.kafka.claims import Watermarks
from effect_ledger.streams.config import KafkaConfig


class Counted(Watermarks):
    """Counts the round trips; the first one can be held after the broker answered it."""

    def __init__(self, cfg: KafkaConfig) -> None:
        super().__init__(cfg)
        self.asked = 0
        self.hold_first = False
        self.answered = threading.Event()
        self.release = threading.Event()

    def _highs(self, c: Any, partition: int) -> tuple[int, int]:
        self.asked += 1
        answer = super()._highs(c, partition)
        if self.asked == 1 and self.hold_first:
            self.answered.set()
            self.release.wait(30)
        return answer


def _write(cfg: KafkaConfig, partition: int) -> None:
    p = Producer(cfg.confluent(**{"acks": "all"}))
    p.produce(cfg.topics.events, b"v", b"k", partition=partition)
    assert p.flush(30) == 0


def test_questions_about_one_partition_share_round_trips(kafka_config: KafkaConfig) -> None:
    marks = Counted(kafka_config)

    async def main() -> list[tuple[int, int]]:
        return await asyncio.gather(*(marks.highs(0) for _ in range(50)))

    try:
        assert set(asyncio.run(main())) == {(0, 0)}
        assert marks.asked <= 2, marks.asked  # the first question's round, and one for all the others
    finally:
        marks.close()


def test_a_question_asked_during_a_round_waits_for_the_next(kafka_config: KafkaConfig) -> None:
    """Read-your-writes: a round under way may have been answered before the record was written."""
    marks = Counted(kafka_config)
    marks.hold_first = True

    async def main() -> tuple[tuple[int, int], tuple[int, int]]:
        first = asyncio.ensure_future(marks.highs(0))
        await asyncio.to_thread(marks.answered.wait, 30)  # the broker answered "0" to the first round
        await asyncio.to_thread(_write, kafka_config, 0)  # then a record is acknowledged
        second = asyncio.ensure_future(marks.highs(0))  # asked after it: must see it
        await asyncio.sleep(0.1)
        marks.release.set()
        return await first, await second

    try:
        first, second = asyncio.run(main())
        assert first == (0, 0)
        assert second == (1, 0)
        assert marks.asked == 2
    finally:
        marks.release.set()
        marks.close()


def test_questions_do_not_wait_for_the_default_executor(kafka_config: KafkaConfig) -> None:
    marks = Watermarks(kafka_config)

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        blocked = [loop.run_in_executor(None, release.wait, 60) for _ in range(64)]
        try:
            return await asyncio.wait_for(marks.highs(1), 20)
        finally:
            release.set()
            await asyncio.gather(*blocked)

    try:
        assert asyncio.run(main()) == (0, 0)
    finally:
        marks.close()
