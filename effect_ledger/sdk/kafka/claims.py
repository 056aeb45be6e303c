"""Claims across hosts (Kafka mode): call the destination only once the processor says the attempt
is this agent's.

Two agents on different hosts can write an intent of the same attempt at the same moment: each
claim is a conditional write in its own SQLite file, so neither sees the other. The key's partition
of ``effects.events`` puts both intents in one total order, and the processor, folding it, records
a ``Claimed`` verdict for the first (``effect.claim_verdict``). An agent that may race (``lookup``
configured, ``sync=True``) therefore asks, after Kafka acknowledged its intent, for the key as the
processor holds it once folded through that intent's offset (``FoldedThrough``), copies the answer
into its file, and calls only when the verdict names its own intent. Otherwise the attempt belongs
to another worker: its own claim is released, and the caller gets the winner's receipt if there is
one already, else ``EffectInProgress`` until the winner's deadline. Without an answer it does not
call either (``LedgerUnavailable``); its intent stays open, for the deadline and the reconcilers.

``settle`` is the only entry point; ``Ledger._run_attempt`` calls it right after the sync wait.

Lookups name what they wait for the same way: ``Watermarks`` asks the broker for the key's
partition's high watermarks (one ListOffsets round trip on a client of its own, a few ms), and the
processor answers once it has folded through them, without a broker query of its own (which queues
behind its consumer's fetch long-poll: about a second).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from effect_ledger.core.effect import REFUSED_CLAIM, Effect, claim_of, fold
from effect_ledger.core.model import Event, Intent, State
from effect_ledger.core.plan import conflict_with
from effect_ledger.errors import EffectInProgress, LedgerUnavailable
from effect_ledger.sdk.kafka.lookup import FoldedThrough, ProcessorLookup
from effect_ledger.sdk.store.sqlite import ClaimOp, Store, VersionConflict
from effect_ledger.streams.acl import client_group
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from effect_ledger.streams.watermarks import high_watermark

_CONFLICT_RETRIES = 16
#: Pauses between asks for a claim verdict while the processor cannot answer yet (doubling, s).
_ASK_AGAIN_FIRST_S = 0.1
_ASK_AGAIN_MOST_S = 1.0
_WATERMARK_TIMEOUT_S = 5.0


class Watermarks:
    """The high watermarks of a key's partition of effects.events and effects.decisions, asked of the
    broker by a consumer of its own (created on first use; never subscribed, so never long-polling).
    The agent asks by key (``of``); the processor's lookups by partition (``highs``).

    Questions about one partition share a round trip: a question that arrives while one is under way
    waits for the next, which starts once that one is answered and answers every question that came
    meanwhile. The next one, not the one under way: an answer must cover every record Kafka had
    acknowledged when the question was asked (read-your-writes), and the one under way may have been
    answered before. So at most one question per partition is ever at the broker, however many
    lookups ask, and each waits at most two round trips. They run on threads of their own: a slow
    broker (a leader paused, metadata stale after a failover) holds them for up to ``timeout_s``
    each, and on the default executor they took the threads that everything else of the process
    waits on (the processor's fold waited behind them for its writes)."""

    #: Threads asking the broker at once (rounds of different partitions).
    THREADS = 4

    def __init__(self, cfg: KafkaConfig, timeout_s: float = _WATERMARK_TIMEOUT_S) -> None:
        self.cfg = cfg
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self._partitions: int | None = None  # of effects.events, as the broker says (not the config)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        # partition -> the round that answers the questions asked since the last one started
        self._next: dict[int, Future[tuple[int, int]]] = {}
        self._asking: set[int] = set()  # partitions with a round at the broker
        self._closed = False
        self.rounds = 0  # round trips made (a measure for tests and benchmarks)

    def _client(self) -> Any:
        """The consumer (made on first call). Call with ``_lock`` held."""
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(
                self.cfg.confluent(
                    **{"group.id": client_group(self.cfg.prefix, "watermarks"), "enable.auto.commit": False}
                )
            )
        return self._consumer

    def _highs(self, c: Any, partition: int) -> tuple[int, int]:
        """Asked again while the broker says "not yet" or the client's metadata is stale (a broker
        died and its partitions moved), within ``timeout_s``: a moment of leader election is not a
        reason to fail an agent's call (``streams.watermarks``)."""
        from confluent_kafka import TopicPartition

        topics = self.cfg.topics
        deadline = time.monotonic() + self.timeout_s
        events, decisions = (
            high_watermark(c, TopicPartition(topic, partition), deadline) for topic in (topics.events, topics.decisions)
        )
        return events, decisions

    def _partition(self, key: str) -> int:
        with self._lock:
            c = self._client()
            if self._partitions is None:
                # The relay's producer partitions by the topic's real partition count: so must this.
                topics = self.cfg.topics
                meta = c.list_topics(topics.events, timeout=self.timeout_s).topics.get(topics.events)
                if meta is None or meta.error is not None or not meta.partitions:
                    raise RuntimeError(f"topic {topics.events} is unknown to the broker")
                self._partitions = len(meta.partitions)
            return partition_for(key.encode(), self._partitions)

    def _round(self, partition: int) -> Future[tuple[int, int]]:
        """The round that answers a question asked now about ``partition`` (class docstring)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the watermarks client is closed")
            round_ = self._next.get(partition)
            if round_ is None:
                round_ = self._next[partition] = Future()
                if partition not in self._asking:
                    self._start(partition)
            return round_

    def _start(self, partition: int) -> None:
        """Send the partition's next round to the broker. Call with ``_lock`` held."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.THREADS, thread_name_prefix="effect-ledger-watermarks")
        round_ = self._next.pop(partition)
        self._asking.add(partition)
        self.rounds += 1
        self._pool.submit(self._ask_broker, partition, round_)

    def _ask_broker(self, partition: int, round_: Future[tuple[int, int]]) -> None:
        try:
            with self._lock:
                c = self._client()
            round_.set_result(self._highs(c, partition))
        except BaseException as e:  # every waiter of the round gets it (a KafkaException: the broker)
            round_.set_exception(e)
        finally:
            with self._lock:
                self._asking.discard(partition)
                if partition in self._next and not self._closed:  # asked meanwhile: their round goes now
                    self._start(partition)

    @staticmethod
    async def _wait(round_: Future[tuple[int, int]]) -> tuple[int, int]:
        # Shielded: a waiter that gives up must not cancel the round the others wait for.
        return await asyncio.shield(asyncio.wrap_future(round_))

    async def of(self, key: str) -> FoldedThrough:
        """What Kafka holds of ``key``'s partition now (the offsets of the newest records); raises
        ``LedgerUnavailable`` when the broker does not answer."""
        try:
            if self._partitions is None:
                partition = await asyncio.to_thread(self._partition, key)  # once: the topic's metadata
            else:
                partition = partition_for(key.encode(), self._partitions)
            events, decisions = await self._wait(self._round(partition))
        except Exception as e:  # a KafkaException: the broker is away, or the topic unknown
            raise LedgerUnavailable(f"cannot read the high watermarks of {key}'s partition: {e}", passing=True) from e
        return FoldedThrough(partition, events - 1, decisions - 1)

    async def highs(self, partition: int) -> tuple[int, int]:
        """The high watermarks (next offsets) of ``partition`` of effects.events and effects.decisions;
        the client's ``KafkaException`` when the broker does not answer within ``timeout_s``."""
        return await self._wait(self._round(partition))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            waiting, self._next = list(self._next.values()), {}
        for round_ in waiting:
            round_.set_exception(RuntimeError("the watermarks client is closed"))
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=False)  # rounds under way end by their timeout
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def owns(effect: Effect, intent: Intent) -> bool | None:
    """Whether ``intent`` owns its attempt per the recorded verdict (None: no verdict known)."""
    verdict = claim_of(effect, intent.attempt)
    return None if verdict is None else verdict.intent_id == intent.event_id


async def settle(
    store: Store,
    lookup: ProcessorLookup,
    offset: tuple[int, int] | None,
    intent: Intent,
    effect: Effect,
    decode: Callable[[str, list[bytes]], list[Event]],
    clock: Callable[[], int],
    until: float | None = None,
) -> Effect:
    """Wait for the processor's verdict on ``intent`` (on Kafka at ``offset``: (partition, offset),
    None when unknown: then the processor waits for the high watermark, which covers it), copy what
    it knows into the file and return the effect. Returns when the intent owns its attempt, or when
    the effect is CONFIRMED (a receipt: the caller returns it, and must not call); raises
    ``EffectInProgress`` when another intent owns it, ``LedgerUnavailable`` when nobody answered.
    ``decode`` turns the answer into events of the key (``Ledger._remote_events``). Until ``until``
    (``time.monotonic()``), a processor that cannot answer yet (``LedgerUnavailable.passing``: it
    lags, rebalances, or a leader is being elected) is asked again."""
    key = intent.effect_id
    after = FoldedThrough(offset[0], offset[1]) if offset is not None else None
    pause = _ASK_AGAIN_FIRST_S
    while True:
        try:
            remote = decode(key, await lookup.events(key, after))
            break
        except LedgerUnavailable as e:
            if e.passing and until is not None and time.monotonic() + pause < until:
                await asyncio.sleep(pause * random.uniform(0.5, 1.5))  # jittered, as execute's
                pause = min(pause * 2, _ASK_AGAIN_MOST_S)
                continue
            raise LedgerUnavailable(
                f"no claim verdict for {key} attempt {intent.attempt} ({e}); destination not called, the "
                "attempt is left to its deadline"
            ) from e
    mine = owns(fold(remote, effect) or effect, intent)
    if mine is None:
        raise LedgerUnavailable(
            f"the ledger processor gave no claim verdict for {key} attempt {intent.attempt} (an older "
            "processor?); destination not called, the attempt is left to its deadline"
        )
    before: Effect | None = effect
    for _ in range(_CONFLICT_RETRIES):
        try:
            # A lost claim drops this worker's claim on the key: the owner's intent now holds it.
            op = ClaimOp.KEEP if mine else ClaimOp.RELEASE
            after_write = await store.append(before, remote, now_ms=clock(), claim_op=op, sent=True)
            effect = after_write.effect
            break
        except VersionConflict:
            before = (await store.load(key)).effect
    else:
        raise EffectInProgress(key, "could not record the claim verdict: the effect kept changing")
    if not mine:
        # The winner's request decides what the key means: a caller with another request gets a
        # conflict, whatever the winner's state, and never the winner's receipt.
        conflict = conflict_with(effect, intent.target, intent.operation, intent.request_digest)
        if conflict is not None:
            raise conflict
    if mine or effect.state is State.CONFIRMED:
        return effect
    verdict = claim_of(effect, intent.attempt)
    assert verdict is not None
    now = clock()
    owner = effect.intent if effect.intent is not None and effect.intent.event_id == verdict.intent_id else None
    retry = max(0, owner.deadline_ms - now) if owner is not None else None
    if verdict.intent_id == REFUSED_CLAIM:
        raise EffectInProgress(
            key,
            f"the ledger refused attempt {intent.attempt}: attempt {intent.attempt - 1} is not settled FAILED or "
            "ABSENT on the log's time (its call may still land); destination not called, ask again later",
            None,
        )
    raise EffectInProgress(
        key, f"worker {verdict.worker} claimed attempt {intent.attempt} first (this intent lost the claim)", retry
    )
