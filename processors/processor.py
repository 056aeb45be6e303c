"""The ledger processor: folds ``effects.events`` and ``effects.decisions`` (people's decisions, on a
topic of their own so that Kafka ACLs can keep it to operators; co-partitioned with the events)
into a table of effects (faust-streaming).

Events come in batches (``take_events``: up to ``batch_max`` events, or what arrived within
``batch_within_s``), grouped by key. Per batch, in this order (at-least-once: faust commits source
offsets after the batch is handled, periodically, so after a crash the events since the last commit
are delivered again; the fold ignores what it has seen, and a replayed event re-sends its table
record and state, in case the crash came before they were delivered):

1. decode; a record that cannot be decoded, that does not belong on its topic (anything but an
   Intent, Executed, Receipt, Resolution or Timeout on ``effects.events``; anything but a Decision
   on ``effects.decisions``), or whose key is not its effect_id, goes to ``effects.dlq`` with the
   reason (a bounded copy), and processing continues;
2. fold each key's events, in order, into its effect (``batch.fold_key``); per changed key, one
   table value (``table_value``: bounded; RocksDB, changelog co-partitioned with
   ``effects.events``), one state for ``effects.state`` (compacted) and, when the effect became
   uncertain, an ``UncertainEffect`` for ``effects.uncertain``; an event that cannot be applied, or
   would make the value too large, is dead-lettered;
3. write them all together and wait until Kafka acknowledged every record (``batch_writer``: the
   order of those writes is written there);
4. count the batch's offsets as processed (lookups wait on them); faust acknowledges the batch's
   events once this returns.

Letting partitions go (``handover``): a worker whose partitions are revoked, or that is told to
stop, waits for the batch it is folding and writing (at most ``drain_s``) before faust rejoins or
leaves the group, and folds nothing of theirs afterwards; a batch that is not written to the end is
never acknowledged, so its events are folded again by their next owner. A worker folds (and its
timer acts) only while the group's coordinator confirmed it a member less than ``MEMBER_FOR_S``
ago (``faust_internals.Membership``): cut off from the coordinator, or paused, it cannot know that
the group has not given its partitions to another worker, and holds its fold meanwhile.

Claims: folding the first intent of an attempt (in the partition's order), the fold records a
``Claimed`` verdict naming it, in the same table write (``batch.fold_key``, ``effect.claim_verdict``);
any later intent of that attempt is a lost claim. The verdict is never sent to a topic (nor accepted
from one): lookups hand it to agents, and a fold of the same partition from scratch records the same.

Retention: a ``Retirement`` command on ``effects.events`` (``effects retire``) replaces a closed
key's value with a retired marker and tombstones its state (``retirement``); later events of the key
are dead-lettered and its lookup answers 410.

Deadlines: a timer (every 100 ms), and the fold after each batch, look at an in-memory index of
*this worker's* open effects (``deadline_index``: rebuilt from the table when faust reports the
table recovered after a rebalance, forgotten when partitions are revoked) and send a Timeout
command through ``effects.events``, so the change happens inside the stream like any other event.
Uncertain effects whose reconciler answered "unknown" are re-published to ``effects.uncertain``
when their backoff has passed, so a restarted reconciler loses no work.

Lookup: ``GET /effects/{key}`` (``lookup_route``). The view listens on ``web_host`` only; bound
beyond loopback it needs a token (``web_token``). faust's own pages (``/router``, ``/table``,
statistics) are not served: they show the table's keys and the cluster's layout to whoever asks.

faust is tuned for throughput (``faust_settings``): no per-message sensors, larger fetches and
buffers, a producer that lingers a little so records share requests; its fetcher hands a record to
the fold without making tasks for it (``faust_internals.quick_handoff``), and the fold's source
reads key and value bytes as they came (``RawSchema``). Private faust parts the processor still
needs live in ``faust_internals``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import faust
from faust.types import TP
from faust.web import Request, Response, View

from effect_ledger.core.deadlines import MAX_CLOCK_AHEAD_MS
from effect_ledger.core.effect import Effect, expire, to_state, uncertain_event
from effect_ledger.core.effect import merge as merge_effects
from effect_ledger.core.model import (
    Claimed,
    Decision,
    Event,
    Executed,
    Intent,
    Receipt,
    Resolution,
    Retirement,
    State,
    Timeout,
    misplaced,
)
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import ConfigError
from effect_ledger.metrics import logs
from effect_ledger.metrics.effects import EffectWatch
from effect_ledger.metrics.logs import DEFAULT_SUMMARY_S, Summary
from effect_ledger.processors import _faust_internals as faust_internals
from effect_ledger.processors import late_records, native_memory, retirement, rocks, table_value
from effect_ledger.processors.batch import fold_key, group_by_key
from effect_ledger.processors.batch_writer import CLIENT_ID as FOLD_CLIENT_ID
from effect_ledger.processors.batch_writer import BatchWriter
from effect_ledger.processors.deadline_index import DeadlineIndex, due_of
from effect_ledger.processors.faust_settings import (
    BATCH_MAX,
    BATCH_WITHIN_S,
    CONNECT_WAIT_S,
    DRAIN_S,
    FETCH_WAIT_S,
    HEARTBEAT_WAIT_S,
    MEMBER_FOR_S,
    METADATA_WAIT_S,
    REQUEST_WAIT_S,
    throughput_settings,
)
from effect_ledger.processors.handover import Handover, LetGo
from effect_ledger.processors.lookup_route import LookupRoute
from effect_ledger.sdk.kafka.claims import Watermarks
from effect_ledger.sdk.kafka.lookup import TOKEN_ENV
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams import codec as codec_mod
from effect_ledger.streams.acl import WORKER_APP_ID
from effect_ledger.streams.admin import LOG_TIME, SAFE_ELECTION
from effect_ledger.streams.config import KafkaConfig, is_loopback
from effect_ledger.streams.dlq import dead_letter as bounded_dead_letter
from effect_ledger.streams.log_clock import LogClock, log_time_of_message
from effect_ledger.streams.partition import partition_for
from effect_ledger.streams.schema_topic import kafka_codec

log = logging.getLogger("effect_ledger.processor")

_CACHE_KEYS = 10_000  # decoded effects kept beside the table (the most recently written)


def _wall_ms() -> int:
    return int(time.time() * 1000)


# Who writes each kind of event, for the clock-skew metric.
_WRITERS: dict[type, str] = {
    Intent: "agent", Executed: "agent", Receipt: "agent", Resolution: "reconciler", Decision: "operator",
    Timeout: "processor", Claimed: "processor",
}  # fmt: skip


@dataclass
class ProcessorSettings:
    kafka: KafkaConfig = field(default_factory=KafkaConfig.from_env)
    app_id: str = WORKER_APP_ID
    data_dir: Path = Path("./effect-ledger-data")
    store: str = "rocksdb://"
    web_host: str = "127.0.0.1"  # the address the lookup view listens on
    web_port: int = 6066
    web_token: str | None = None  # required by lookups when set; needed when web_host is not loopback
    advertised_url: str | None = None  # how other workers reach this one's view (default: host:port)
    # How often the timer samples the high watermarks and acts on past deadlines. A batch that
    # folds a partition up to a sample acts at once too (``act_on_due``): the tick's period is
    # paid once, not twice, in the time from a deadline to its uncertain event.
    timer_interval_s: float = 0.1
    grace_ms: int = 1000
    lookup_bound_s: float = 5.0
    # The declared targets (``effects worker --targets``): each one's backoff spaces the checks of
    # its uncertain effects; a target not declared here gets the default backoff.
    targets: Mapping[str, Target] = field(default_factory=dict)
    first_check_ms: int = 60_000  # re-publish an uncertain effect nobody has answered for this long
    batch_max: int = BATCH_MAX  # most events folded in one batch
    batch_within_s: float = BATCH_WITHIN_S  # how long a batch waits to fill
    # How long a worker whose partitions are revoked, or that is told to stop, waits at most for the
    # batch it is writing (its records must be in Kafka before the next owner reads the changelog).
    drain_s: float = DRAIN_S
    clock: Callable[[], int] = _wall_ms  # milliseconds since the epoch: deadlines, metrics
    # How often the C allocator's free pages go back to the system (processors/native_memory.py)
    # and RocksDB's memory is counted for /metrics (0: never).
    memory_interval_s: float = 10.0
    # How often the worker asks the broker whether its ACLs still give it every right it needs
    # (``streams.acl.NEEDS["worker"]``): one it lost makes it not ready, with the right named.
    rights_interval_s: float = 15.0
    # Seconds between the worker's summary log lines (``effects worker --log-summary``; 0: none).
    summary_s: float = DEFAULT_SUMMARY_S
    log_format: str = "text"  # the log lines' format (``--log-format``): also for --processes' children

    @property
    def full_app_id(self) -> str:
        return f"{self.kafka.prefix}{self.app_id}"

    def check_web(self) -> None:
        """Refuse a lookup view reachable beyond this machine without a token: it answers every
        event of an effect, request bodies included."""
        if not is_loopback(self.web_host) and not self.web_token:
            raise ConfigError(
                f"the lookup view would listen on {self.web_host}, beyond loopback, without a token: "
                f"set --web-token or {TOKEN_ENV}, or listen on 127.0.0.1"
            )


class LedgerProcessor:
    """Builds and holds the faust app. ``app`` is what ``faust.Worker`` runs."""

    def __init__(self, settings: ProcessorSettings, metrics: Any = None) -> None:
        settings.check_web()
        self.s = settings
        self.metrics = metrics  # a LedgerMetrics (effect_ledger.metrics.names), or None
        self._served = False  # ready at least once (see _not_ready)
        self.codec = kafka_codec(settings.kafka, writes=True)  # publishes its schemas, learns newer ones
        k = settings.kafka
        topics = k.topics
        self.app = _App(
            settings.full_app_id,
            broker=[f"kafka://{b.strip()}" for b in k.bootstrap.split(",")],
            broker_credentials=faust_credentials(k),
            # The table's store, set app-wide: faust ignores a Table's own URL that has no path (falsy).
            store=rocks.store_url(settings.store),
            datadir=str(settings.data_dir),
            topic_partitions=k.partitions,
            # Replicated like the topics (the worker command decides it for the cluster first).
            topic_replication_factor=_replication(k),
            processing_guarantee="at_least_once",
            consumer_auto_offset_reset="earliest",
            web_host=settings.web_host,
            web_bind=settings.web_host,  # faust binds 0.0.0.0 unless told; web_host only names it
            web_port=settings.web_port,
            # faust's own pages list the table's keys and the cluster's layout: not served.
            web_router_enabled=False,
            web_tables_enabled=False,
            web_graph_enabled=False,
            web_stats_enabled=False,
            web_metrics_enabled=False,
            canonical_url=settings.advertised_url or f"http://{settings.web_host}:{settings.web_port}",
            web_in_thread=False,
            table_standby_replicas=0,
            stream_wait_empty=False,
            producer_acks=-1,
            **throughput_settings(),
        )
        raw: dict[str, Any] = {
            "key_type": bytes,
            "value_type": bytes,
            "key_serializer": "raw",
            "value_serializer": "raw",
        }
        self.events = self.app.topic(topics.events, partitions=k.partitions, **raw)
        self.decisions = self.app.topic(topics.decisions, partitions=k.partitions, **raw)
        # The fold's source: both topics in one agent, so faust assigns their partitions together
        # (co-partitioned: same count, same keys) and one table holds every fact of a key.
        self.sources = self.app.topic(topics.events, topics.decisions, partitions=k.partitions, schema=RawSchema(**raw))
        self.state_topic = self.app.topic(topics.state, partitions=k.partitions, **raw)
        self.uncertain = self.app.topic(topics.uncertain, partitions=k.partitions, **raw)
        self.dlq = self.app.topic(topics.dlq, partitions=k.partitions, **raw)
        self.table = self.app.Table(
            "effects",
            default=None,
            partitions=k.partitions,
            key_type=str,
            value_type=bytes,  # the store picks the "raw" codec for bytes: table_value's encoding, untouched
            # The broker stamps the changelog's records (a CreateTime topic would refuse them from a
            # worker whose clock runs over an hour ahead: streams/admin.py, LOG_TIME); durable like
            # the topics (min.insync.replicas, no unclean election).
            extra_topic_configs={**LOG_TIME, **SAFE_ELECTION, "min.insync.replicas": str(k.min_insync)},
        )
        # A recovery merges a changelog record with the value held when each holds facts the other
        # lacks (``late_records``): the union is decoded, folded and encoded here.
        store: Any = self.table.data
        if hasattr(store, "late"):
            store.merge = self._merge_values
        self.index = DeadlineIndex(grace_ms=settings.grace_ms)
        # The log's time (its records' LogAppendTime, plus this process's monotonic clock since): what
        # deadlines are decided on here, never this host's wall clock (streams/log_clock.py).
        self.log_clock = LogClock(settings.clock)
        self._skew_warned: dict[str, float] = {}
        # What the worker says (effect_ledger.metrics.logs): its notable events, one line each, and
        # a summary of its counts every ``summary_s``; the same changes move the counters.
        self.summary = Summary(log, settings.summary_s)
        self.watch = EffectWatch(metrics, log, self.summary)
        # The timer and the fold (after a batch) both act on due deadlines: one at a time, or both
        # could send a key's Timeout before either marked it sent.
        self._acting = asyncio.Lock()
        self.processed: dict[int, int] = {}  # partition -> last offset of effects.events folded
        self.processed_decisions: dict[int, int] = {}  # the same for effects.decisions
        self.missing_rights: list[str] = []  # Kafka rights the ACLs took away since the start (check_rights)
        # Most recently written last, each as (table value, effect, table key). An OrderedDict:
        # evicting a plain dict's first key makes next(iter()) step over every key deleted before it
        # (9 µs a write at 10,000 keys, not 0.7).
        self._cache: OrderedDict[str, tuple[bytes, Effect, bytes]] = OrderedDict()
        self._out: BatchWriter | None = None  # made on first use, in the worker's process
        self._changelog_reader: Any = None  # reads what another writer put in the changelog (late_records)
        self._reading = asyncio.Lock()  # the reader is used by one read at a time, and closed after it
        self._stopped = False
        self._read: Callable[[int, bytes], bytes | None] | None = None  # the same
        # The lookups ask the broker for high watermarks through a client of their own: faust's
        # consumer runs its requests one after another in its thread, where a lookup's question
        # waited behind fetches and commits (seconds, on a worker catching up after a restart: the
        # forwarding worker gave up and said nobody owned the partition).
        self._watermarks = Watermarks(k, timeout_s=settings.lookup_bound_s)
        self.route = LookupRoute(
            partitions=k.partitions,
            bound_s=settings.lookup_bound_s,
            token=settings.web_token,
            own_url=str(self.app.conf.canonical_url),
            ready=lambda: self.ready,
            not_ready=self._not_ready,
            assigned=self._assigned,
            highwaters=self._watermarks.highs,
            folded=lambda p: (self.folded_through(p), self.folded_through(p, self.decisions.get_topic_name())),
            load=self._load,
            encode_event=lambda ev: self.codec.encode(ev, validate=False),
            peers=lambda: faust_internals.peer_urls(self.app),
            retired=self._retired_answer,
            sleep=self._until_next_batch,
        )
        self._batch_done = asyncio.Event()  # set (and replaced) after every batch: lookups wait on it
        self.membership = faust_internals.Membership()
        self._batch_epoch = 0
        self.handover = Handover(
            self.s.drain_s,
            faust_internals.leave_unacknowledged,
            self._forget_partitions,
            member=self._member,
            why_not_member=self._why_not_member,
            current=self._fetched_in_this_generation,
        )
        self.app.before_stop = self._stopping
        self._register()

    def _fetched_in_this_generation(self, event: Any) -> bool:
        # faust stamps each message with the group generation it was fetched in, and its stream
        # skips those of an earlier one; its take buffer does not (handover's module docstring).
        return bool(event.message.generation_id == self.app.consumer_generation_id)

    # -- wiring ----------------------------------------------------------------------------

    def _register(self) -> None:
        app = self.app

        @app.agent(self.sources, name="fold")
        async def fold(stream: Any) -> None:
            faust_internals.quick_handoff(app)
            faust_internals.rewind_dropped_fetches(app)
            async for batch in stream.take_events(self.s.batch_max, within=self.s.batch_within_s):
                try:
                    await self.handle_batch(batch)
                except LetGo:
                    continue  # left to the partitions' next owner (handover says so in the log)
                except Exception as e:
                    # A batch that could not be folded and written (Kafka refused a record for
                    # good) cannot be stepped over: faust would restart the fold past it, and
                    # commit past its events once later ones are acknowledged. The worker stops;
                    # its next start reads again from the group's committed offset.
                    log.error("stopping the worker: %s: %s", type(e).__name__, e)
                    await app.crash(e)
                    return
                try:
                    await self.act_on_due()
                except Exception as e:  # the timer acts on them at its next tick
                    log.warning("acting on due deadlines after a batch: %s: %s", type(e).__name__, e)

        if self.s.memory_interval_s > 0:

            @app.timer(interval=self.s.memory_interval_s, name="memory")
            async def memory() -> None:
                await self.look_after_memory()

        @app.timer(interval=self.s.timer_interval_s, name="deadlines")
        async def deadlines() -> None:
            await self.tick()

        if self.s.rights_interval_s > 0:

            @app.timer(interval=self.s.rights_interval_s, name="rights")
            async def rights_check() -> None:
                await self.check_rights()

        # The deadline index follows faust's signals: forgotten when partitions are revoked,
        # rebuilt once the table has recovered the new assignment (before streams resume).
        @self.table.on_recover
        async def recovered() -> None:
            faust_internals.hold_fetching_until_streams_resume(app)
            self._rebuild_index(self._assigned())

        # faust sends on_rebalance_complete when table recovery ends, before it seeks the source
        # partitions back to their committed offsets: from then on, a partition with no commit
        # goes back to its first record too (faust_internals.seek_uncommitted_to_start). (mode's
        # handler type names the signal's generic sender type, which a plain function here cannot
        # spell; faust calls it as receiver(sender, signal=...).)
        sources = frozenset({self.events.get_topic_name(), self.decisions.get_topic_name()})

        def seek_uncommitted(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
            faust_internals.seek_uncommitted_to_start(app, sources)

        app.on_rebalance_complete.connect(cast(Any, seek_uncommitted))

        def watch_group() -> bool:
            """Bound the consumer's requests and watch its membership (idempotent): True when the
            membership was installed by this call."""
            faust_internals.bound_requests(app, REQUEST_WAIT_S, CONNECT_WAIT_S, HEARTBEAT_WAIT_S, FETCH_WAIT_S)
            faust_internals.majority_metadata(app, METADATA_WAIT_S)
            return faust_internals.confirm_membership(app, self.membership, HEARTBEAT_WAIT_S)

        @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust passes the revoked set too
        async def revoked(_app: Any, revoked: Any, **kwargs: Any) -> None:
            self._say_partitions("partitions_revoked", "revoked", revoked)
            watch_group()  # before the join: it is heard
            await self.handover.revoke(frozenset(revoked))

        @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # faust passes the assigned set too
        async def assigned(_app: Any, assigned: Any, **kwargs: Any) -> None:
            self._say_partitions("partitions_assigned", "assigned", assigned)
            if watch_group():
                # Installed only now: the join that assigned these was missed; its answer came
                # before this signal (faust's assignment callbacks ran in between).
                self.membership.confirmed(self.membership.clock())
            self.handover.assign(frozenset(assigned))

        processor = self

        @app.page("/effects/{key}")
        class EffectPage(View):
            async def get(self, request: Request, key: str) -> Response:
                status, body = await processor.route.get(
                    key,
                    request.headers.get("Authorization", ""),
                    bool(request.query.get("owner-only")),
                    request.query,
                )
                return self.json(body, status=status)

        @app.page("/health")
        class Health(View):
            async def get(self, request: Request) -> Response:
                return self.json(
                    {
                        "ready": processor.ready,
                        "missing_rights": processor.missing_rights,
                        "in_recovery": bool(app.in_recovery),
                        "partitions": sorted(processor.index.assigned or ()),
                        "processed": processor.processed,
                        "open": len(processor.index),
                        "rocksdb": processor.rocksdb_memory(),
                    }
                )

    async def check_rights(self) -> None:
        """Ask the broker which of the worker's rights its ACLs no longer give (checked at start
        by ``effects worker``), and whether it still accepts the worker's login (a password
        rotated under a running worker: every new connection fails): while either is so the
        worker is not ready, and says why. No answer changes nothing (the broker may be away;
        that is not a lost right)."""
        from effect_ledger.errors import BrokerRefusedLogin
        from effect_ledger.streams import rights
        from effect_ledger.streams.admin import wait_ready

        def ask() -> list[str]:
            try:
                wait_ready(self.s.kafka, 10.0)
            except BrokerRefusedLogin as e:  # a rotated password: new connections fail, so must it
                return [f"login: {e}"]
            return rights.missing_rights(self.s.kafka, "worker", 10.0)

        try:
            missing = await asyncio.to_thread(ask)
        except Exception as e:
            log.warning("could not check the worker's Kafka rights: %s: %s", type(e).__name__, e)
            return
        if missing != self.missing_rights:
            if missing:
                log.error("Kafka no longer gives this worker: %s (not ready until it does)", "; ".join(missing))
            else:
                log.warning("Kafka gives this worker every right it needs again")
        self.missing_rights = missing

    async def look_after_memory(self) -> None:
        """Hand the allocator's free pages back (on a thread: a call takes milliseconds) and set
        the RocksDB gauge. Housekeeping: a failure is logged, never a reason to stop folding."""
        try:
            if native_memory.available():
                await asyncio.to_thread(native_memory.release_free_memory)
            counts = self.rocksdb_memory()
            if self.metrics is not None and counts is not None:
                for kind, n in counts.items():
                    self.metrics.rocksdb_bytes.labels(kind=kind).set(n)
        except Exception as e:
            log.warning("looking after memory: %s: %s", type(e).__name__, e)

    def rocksdb_memory(self) -> dict[str, int] | None:
        """RocksDB's own counts of the table's memory, in bytes (None: not a RocksDB store)."""
        store = self.table.data
        return store.memory() if isinstance(store, rocks.Store) else None

    def _not_ready(self) -> str:
        """Why lookups are refused now, in the words an on-call reads in the agents' errors."""
        if self.missing_rights:
            return f"Kafka no longer gives this worker: {'; '.join(self.missing_rights)}"
        if not self._served:
            return "the processor is starting"
        if self.app.rebalancing:
            return "the workers' group is rebalancing (a worker or the group's coordinator came or went)"
        if self.app.in_recovery:
            return "the processor is recovering its table after a rebalance"
        if not self._member():
            return self._why_not_member()
        return "the processor is taking on its new partitions"

    @property
    def ready(self) -> bool:
        """Recovered and owning its partitions (the deadline index was built for them), with every
        Kafka right it needs."""
        app = self.app
        ready = (
            not self.missing_rights
            and self.index.assigned is not None
            and not app.in_recovery
            and not app.rebalancing
            and self.index.assigned == self._assigned()
            and self._member()
        )
        self._served = self._served or ready  # once ready, a later refusal is not "starting"
        return ready

    def _member(self) -> bool:
        """Whether the group's coordinator confirmed this worker a member recently enough that its
        session cannot have expired (its partitions are its own): only then does it fold or act."""
        age = self.membership.age()
        return age is not None and age < MEMBER_FOR_S

    def _why_not_member(self) -> str:
        age = self.membership.age()
        if age is None:
            return "this worker is not a member of the workers' group"
        return f"the workers' group has not confirmed this worker a member for {age:.0f} s"

    def _assigned(self) -> frozenset[int]:
        return frozenset(
            tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.events.get_topic_name()
        )

    async def _stopping(self) -> None:
        self.summary.emit()  # what it counted since the last summary, before it goes
        await self.handover.stop()
        async with self._reading:
            self._stopped = True
            if self._changelog_reader is not None:
                await asyncio.to_thread(self._changelog_reader.close)
                self._changelog_reader = None

    def _say_partitions(self, name: str, verb: str, tps: Any) -> None:
        """One line per rebalance: the events partitions this worker was given or lost."""
        topic = self.events.get_topic_name()
        parts = sorted(tp.partition for tp in tps if tp.topic == topic)
        self.summary.count(name.replace("partitions_", "rebalances_"))
        logs.event(
            log, name, f"partitions {verb}: {parts or 'none'} of {topic}",
            topic=topic, partitions=parts, group=self.s.full_app_id,
        )  # fmt: skip

    def _forget_partitions(self) -> None:
        """Partitions were revoked: what this worker holds about them is no longer the table."""
        self.index.forget()
        self._cache.clear()  # another worker may write these keys now
        if self._out is not None:
            self._out.forget_expected()

    # -- the fold --------------------------------------------------------------------------

    async def handle_batch(self, batch: list[Any]) -> None:
        """Fold one batch from faust (see the module docstring for the order of writes), the
        events the worker may still fold (``handover``)."""
        async with self.handover.batch(batch) as events:
            await self._fold_batch(events)

    async def _fold_batch(self, batch: list[Any]) -> None:
        self._batch_epoch = self.membership.epoch  # the membership the batch is folded under
        taken = self._write_kept_again()
        try:
            await self._fold_events(batch)
        except BaseException:
            self._not_written(taken)
            raise

    async def _fold_events(self, batch: list[Any]) -> None:
        decisions_topic = self.decisions.get_topic_name()
        items: list[tuple[str, Any, Event]] = []
        done: dict[tuple[bool, int], int] = {}
        for event in batch:
            msg = event.message
            from_decisions = msg.topic == decisions_topic
            done[(from_decisions, msg.partition)] = msg.offset
            ev = await self._accept(event, from_decisions)
            if isinstance(ev, Retirement):
                # A command to the table (retention), applied in the stream's order: what came
                # before it in the batch is folded first. Rare: a flush costs nothing.
                for key, evs in group_by_key(items).items():
                    await self._fold_key(key, evs)
                items = []
                await self._write()  # what the retirement reads is in the table
                with faust_internals.as_current_event(event):
                    await retirement.apply(self, msg, ev)
            elif ev is not None:
                items.append((ev.effect_id, event, ev))
                if self.metrics is not None:
                    self._observe_skew(event, ev)
        for key, evs in group_by_key(items).items():
            await self._fold_key(key, evs)
        await self._write()
        self.summary.count("events", len(batch))
        for (from_decisions, p), offset in done.items():
            (self.processed_decisions if from_decisions else self.processed)[p] = offset
        self._batch_done.set()
        self._batch_done = asyncio.Event()

    def _write_kept_again(self) -> dict[int, list[bytes]]:
        """Put in the batch the table values a recovery of this worker kept over (or merged with) a
        late changelog record (``late_records``), in the partitions it owns, at most
        ``MAX_REWRITE`` a batch: written again, they are the last record of their key in the
        changelog, which compaction keeps. What the table holds now is written (a fold since the
        recovery may have changed it); the batch's own folds of the same keys come after and replace
        it. Returns the keys taken, noted again by the caller if the batch is not written."""
        late = getattr(self.table.data, "late", None)
        if late is None or len(late) == 0:
            return {}
        taken = late.take(self.index.assigned or ())
        for part, keys in taken.items():
            for tkey in keys:
                value = self.read_table(part, tkey)
                if value is not None:
                    self.out.put(part, tkey, value)
            log.info("changelog partition %d: %d value(s) kept over late records written again", part, len(keys))
        return taken

    def _merge_values(self, held: bytes, incoming: bytes) -> bytes | None:
        """The table value of the union of two values' facts (``core.effect.merge``), or None when
        either cannot be read or the union would be over the table value's limit (the record is then
        applied as faust would)."""
        try:
            a = table_value.decode(held, self.codec.decode)
            b = table_value.decode(incoming, self.codec.decode)
            if a is None or b is None:
                return None
            union = merge_effects(a, b)
            return table_value.encode(union, due_of(union, self.s.targets, self.s.first_check_ms))
        except Exception as e:
            log.error("changelog: two values of one key could not be merged (%s: %s)", type(e).__name__, e)
            return None

    def _not_written(self, taken: dict[int, list[bytes]]) -> None:
        """The batch carrying ``taken`` (``_write_kept_again``) was not written: noted again."""
        late = getattr(self.table.data, "late", None)
        if late is not None and taken:
            late.again(taken)

    async def _write(self) -> None:
        """Write what the batch collected, once the worker still knows itself a member: it may have
        stopped knowing while it folded (paused, cut off). ``LetGo`` when its partitions are being
        let go meanwhile: nothing is written (the revocation forgets what the fold cached)."""
        if not await self.handover.confirmed():
            self.out.discard()
            raise LetGo("the batch's partitions are being let go before its writes")
        await self.out.flush()
        if self.out.foreign:
            await self._answer_foreign()

    async def _answer_foreign(self) -> None:
        """Another writer's records landed in the changelog between this worker's own, in partitions
        it holds (``batch_writer``): a previous owner's late batch. Their keys' values, as this
        worker holds them, are written again at once, so that the late values are not the keys'
        last records (``late_records``). A read that fails is tried again after the next batch (the
        stretches stay in ``foreign``; until then the changelog offset recorded as held stays
        before them, so that a restart's recovery weighs them)."""
        late = getattr(self.table.data, "late", None)
        if late is None:
            self.out.foreign = []
            return
        gaps = list(self.out.foreign)
        topic = self.table.changelog_topic.get_topic_name()
        try:
            async with self._reading:
                if self._stopped:
                    return
                if self._changelog_reader is None:
                    from confluent_kafka import Consumer

                    self._changelog_reader = Consumer(
                        self.s.kafka.confluent(**{"group.id": self.s.full_app_id, "enable.auto.commit": False})
                    )
                found, short = await asyncio.to_thread(late_records.foreign_keys, self._changelog_reader, topic, gaps)
        except Exception as e:
            log.error(
                "changelog: the records another worker wrote between this worker's own could not be read (%s: %s): "
                "tried again after the next batch",
                type(e).__name__, e,
            )  # fmt: skip
            return
        self.out.foreign = []
        for part, tkey, offset in found:
            late.note(part, tkey, offset)
        for part, first, end in gaps:
            log.warning(
                "changelog partition %d: offsets %d-%d were written by another worker between this worker's own "
                "records (a previous owner's batch, delivered late): the values of their keys are written again",
                part, first, end - 1,
            )  # fmt: skip
        if short is not None:
            log.error("changelog: the records another worker wrote were not all read (%s)", short)
        taken = self._write_kept_again()
        if len(self.out) == 0:
            return
        try:
            if not await self.handover.confirmed():
                self.out.discard()
                self._not_written(taken)
                return
            await self.out.flush()
        except BaseException:
            self._not_written(taken)
            raise

    async def _until_next_batch(self, timeout_s: float) -> None:
        """Return once the next batch is folded, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._batch_done.wait(), timeout_s)

    async def _accept(self, event: Any, from_decisions: bool) -> Event | Retirement | None:
        """The event in a record, or None when it was dead-lettered."""
        msg = event.message
        try:
            ev = self.codec.decode(event.value)
        except codec_mod.DecodeError as e:
            await self.dead_letter(msg, str(e))
            return None
        if self.metrics is not None:
            self.metrics.events.labels(kind=type(ev).__name__).inc()
        if isinstance(ev, Retirement) and not from_decisions:
            return ev  # a retention command (``retirement.apply`` checks its key)
        why = misplaced(ev, decisions_topic=from_decisions)
        if why is not None:
            # Folded, a state record or a reconcilers' work item would be taken for a fact about
            # the key and poison every later event of it; a DeadLetter has no key at all.
            await self.dead_letter(msg, why)
            return None
        key = ev.effect_id
        if msg.key is not None and msg.key != key.encode():
            await self.dead_letter(msg, f"record key {msg.key!r} is not its effect_id {key!r}")
            return None
        if from_decisions and msg.partition != partition_for(key.encode(), self.s.kafka.partitions):
            # The table keeps a key in its events partition: a decision elsewhere would be folded
            # into a copy of the effect that no lookup and no timer ever reads.
            await self.dead_letter(msg, f"decision for {key!r} on partition {msg.partition}, not the key's")
            return None
        return ev  # type: ignore[return-value]

    async def _fold_key(self, key: str, evs: list[tuple[Any, Event]]) -> None:
        last = evs[-1][0]
        part = last.message.partition
        # The key's partition is read (``read_table``) and written (``out``) by number; its last event is
        # faust's current event all the same, for what faust sends meanwhile (a dead letter).
        with faust_internals.as_current_event(last):
            cached = self._cache.get(key)
            tkey = cached[2] if cached is not None else self.table_key(key)  # faust's serializer: µs a key
            # A key this worker wrote since it was given the partition is in the table as cached
            # (the cache is emptied whenever partitions are revoked): no read.
            previous = cached[0] if cached is not None else self.read_table(part, tkey)
            if retirement.is_marker(previous):
                assert previous is not None
                for event, _ev in evs:  # a retired key stays retired: nothing brings it back
                    await self.dead_letter(event.message, retirement.refusal(previous))
                return
            before: Effect | None
            try:
                if cached is not None:
                    before = cached[1]
                else:
                    before = self._load(key, previous) if previous is not None else None
            except Exception as e:  # a value this release cannot read must not stop the partition
                for event, _ev in evs:
                    await self.dead_letter(event.message, f"cannot read the table value: {type(e).__name__}: {e}")
                return
            due: list[int | None] = [None]

            def encode(effect: Effect) -> bytes:
                due[0] = due_of(effect, self.s.targets, self.s.first_check_ms)
                return table_value.encode(effect, due[0])

            result = fold_key(before, evs, encode, self._log_ms)
            for event, reason in result.rejected:
                await self.dead_letter(event.message, reason)
            after = result.after
            if result.value is None or after is None:
                if previous is not None and before is not None:
                    # Already folded — most often a replay after a crash, which may have come after
                    # the table write but before its changelog record and the state were
                    # delivered. Both writes are idempotent: write them again rather than risk
                    # them being lost.
                    self.out.put(part, tkey, previous)
                    self._publish(key, before, (), part)
                return
            self.out.put(part, tkey, result.value)
        for b, a, ev in result.steps:
            self._observe(b, a, ev)
        self._cache[key] = (result.value, after, tkey)
        self._cache.move_to_end(key)
        if len(self._cache) > _CACHE_KEYS:
            self._cache.popitem(last=False)
        self.index.set(key, part, due[0])
        self._publish(key, after, result.emitted, part)

    def _log_ms(self, event: Any) -> int | None:
        """When the log took this record (its LogAppendTime; None on a topic whose records carry the
        producer's time), noted as the log's latest time and against its writer's claimed time."""
        ms = log_time_of_message(event.message)
        if ms is not None:
            self.log_clock.observe(ms)
        return ms

    def _observe_skew(self, event: Any, ev: Event) -> None:
        """Each writer's clock against the log's (the metric), and a warning, at most once a minute a
        kind of writer, for one that runs more than ``MAX_CLOCK_AHEAD_MS`` ahead."""
        log_ms = self._log_ms(event)
        if log_ms is None:
            return
        writer = _WRITERS.get(type(ev), "agent")
        skew = ev.at_ms - log_ms
        self.metrics.writer_clock_skew.labels(writer=writer).set(skew / 1000)
        if skew > MAX_CLOCK_AHEAD_MS:
            self.metrics.clock_skew_flagged.labels(writer=writer).inc()
            now = time.monotonic()
            if now - self._skew_warned.get(writer, -60.0) >= 60:
                self._skew_warned[writer] = now
                who = getattr(ev, "worker", None) or getattr(ev, "by", None) or getattr(ev, "reconciler", "?")
                log.warning(
                    "%s %s's clock is %.1f s ahead of the log's (%s on %s): flagged CLOCK_SKEW, its ABSENT refused",
                    writer, who, skew / 1000, type(ev).__name__, ev.effect_id,
                )  # fmt: skip

    def table_key(self, key: str) -> bytes:
        """The bytes the table stores ``key`` under."""
        return faust_internals.table_key(self.table, key)

    def read_table(self, partition: int, tkey: bytes) -> bytes | None:
        """The table's value under ``tkey`` (``table_key``) in ``partition``, or None."""
        if self._read is None:
            self._read = faust_internals.table_reader(self.table)
        return self._read(partition, tkey)

    @property
    def out(self) -> BatchWriter:
        """The writer of the current batch's table values and records (``batch_writer``)."""
        if self._out is None:
            from confluent_kafka import Producer

            db_for, write_batch = faust_internals.table_partitions(self.table)
            self._out = BatchWriter(
                Producer(producer_config(self.s.kafka, **{"client.id": FOLD_CLIENT_ID})),
                self.table.changelog_topic.get_topic_name(),
                db_for,
                write_batch,
                self._persist_changelog_offset,
            )
            self._out.on_log_time = self.log_clock.observe
        return self._out

    def _persist_changelog_offset(self, partition: int, offset: int) -> None:
        """A batch's last step: record that this worker's store holds the partition's changelog up
        to ``offset``, where a recovery of the partition starts reading it again. True only if no
        other worker wrote to it since this worker's previous records: if the worker did not stay the
        confirmed member holding its partitions while the batch was written (a cut or a pause, and a
        batch Kafka acknowledged only after the heal), another may have, before these records. The
        offset is then not recorded, and a recovery reads again from the one before: otherwise it
        would start past the other worker's records, and keep this worker's older values."""
        if self._member() and self.membership.epoch == self._batch_epoch:
            faust_internals.persist_changelog_offset(self.table, partition, offset)
            return
        log.warning(
            "changelog partition %d: offset %d not recorded as held (the batch was acknowledged after this worker "
            "stopped knowing itself the partition's owner): a recovery reads the changelog again from the offset "
            "recorded before it",
            partition,
            offset,
        )

    def _publish(self, key: str, effect: Effect, emitted: Any, part: int) -> None:
        # The outputs are co-partitioned with effects.events (same key, same partition count).
        kb = key.encode()
        st = to_state(effect)
        self.out.produce(
            self.state_topic.get_topic_name(), part, kb, self.codec.encode(st, validate=False), [self.codec.header(st)]
        )
        for u in emitted:
            self.out.produce(self.uncertain.get_topic_name(), part, kb, self.codec.encode(u), [self.codec.header(u)])

    def _observe(self, before: Effect | None, after: Effect, ev: Any) -> None:
        """Counters and log lines for one folded change (the effect is decoded already: nothing is
        read). Every way into UNCERTAIN counts, the agent's own unknown outcomes included."""
        self.watch(before, after, (ev,))
        m = self.metrics
        if m is None:
            return
        was = before.state if before is not None else None
        if isinstance(ev, Executed):
            m.unrecorded_window.observe(max(0, ev.at_ms - ev.call_ended_ms) / 1000)
        if after.state is State.UNCERTAIN and was is not State.UNCERTAIN and isinstance(ev, Timeout):
            if before is not None and before.deadline_ms is not None:
                m.detection_latency.observe(max(0, self.log_clock.now() - before.deadline_ms) / 1000)

    def _load(self, key: str, value: bytes | None = None) -> Effect | None:
        """The folded effect of ``key``: from ``value`` (read by the fold, in the key's partition),
        else read from the table by key alone (lookups, the timer)."""
        if value is None:
            with faust_internals.no_current_event():
                value = self.table.get(key)
        if value is None or retirement.is_marker(value):
            return None  # unknown, or retired (the lookup answers 410 for it: ``_retired_answer``)
        cached = self._cache.get(key)
        if cached is not None and cached[0] == value:
            return cached[1]
        return table_value.decode(value, self.codec.decode)

    def _retired_answer(self, key: str) -> dict[str, Any] | None:
        """The lookup's answer (410) for a retired key, or None."""
        with faust_internals.no_current_event():
            value = self.table.get(key)
        return retirement.lookup_answer(key, value) if value is not None and retirement.is_marker(value) else None

    async def dead_letter(self, msg: Any, reason: str) -> None:
        log.warning("dead letter %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, reason[:500])
        dl, dlq_key = bounded_dead_letter(
            self.s.clock(),
            self.s.full_app_id,
            msg.topic,
            msg.partition,
            msg.offset,
            reason,
            msg.key,
            msg.value,
        )
        await self.dlq.send(
            key=dlq_key, value=self.codec.encode(dl), headers=[self.codec.header(dl)], partition=msg.partition
        )
        if self.metrics is not None:
            self.metrics.dead_letters.inc()

    # -- deadlines -------------------------------------------------------------------------

    async def tick(self) -> None:
        """The timer: sample each partition's high watermark, then act on the deadlines due."""
        if not self.ready:
            return  # the table is not complete yet: a deadline could fire on stale state
        assigned = self.index.assigned or frozenset()
        topic = self.events.get_topic_name()
        tps = [TP(topic, p) for p in sorted(assigned)]
        now = self.log_clock.now()
        hws = await self._highwaters(tps)
        self.index.record_highwaters(now, {tp.partition: int(hws.get(tp) or 0) for tp in tps})
        if self.metrics is not None:
            self._gauges(tps, hws, now)
        self.summary.tick(open_effects=len(self.index), partitions=sorted(assigned))
        async with self._acting:
            await self._act(now)

    async def act_on_due(self) -> None:
        """After a batch: act on the deadlines the batch made actionable (folded up to where their
        partition stood once they passed) without waiting for the next tick. The index says from
        the top of each partition's heap when nothing is past due, the common case."""
        now = self.log_clock.now()
        if not self.ready or not self.index.any_past_due(now) or self._acting.locked():
            return
        async with self._acting:
            await self._act(now)

    async def _act(self, now: int) -> None:
        for key, entry in self.index.due(now, self.folded_through):
            effect = self._load(key)
            if effect is None:
                self.index.discard(key)
                continue
            kb = key.encode()
            if effect.state is State.UNCERTAIN:
                # Ask the reconcilers again; if nobody answers, again after first_check_ms.
                u = uncertain_event(effect)
                await self.uncertain.send(
                    key=kb, value=self.codec.encode(u), headers=[self.codec.header(u)], partition=entry.partition
                )
                self.index.mark_sent(key, entry.partition, now + self.s.first_check_ms, now)
            else:
                # A timeout command; sent again after RESEND_AFTER_MS if it was not folded by then.
                for t in expire(effect, now):
                    await self.events.send(
                        key=kb, value=self.codec.encode(t), headers=[self.codec.header(t)], partition=entry.partition
                    )
                self.index.mark_sent(key, entry.partition, entry.due_ms, now)

    def _gauges(self, tps: list[TP], hws: dict[TP, int], now: int) -> None:
        """Lag per partition from the high watermarks the timer fetched anyway; the open effects
        and the most overdue from the deadline index (no table read)."""
        m = self.metrics
        for tp in tps:
            lag = int(hws.get(tp) or 0) - self.folded_through(tp.partition) - 1
            m.consumer_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(max(0, lag))
        m.open_effects.set(len(self.index))
        oldest = self.index.oldest_due()
        m.oldest_overdue.set(max(0, now - oldest - self.s.grace_ms) / 1000 if oldest is not None else 0)

    async def _highwaters(self, tps: list[TP]) -> dict[TP, int]:
        """The high watermarks the consumer learnt from its last fetch responses (no round trip:
        a timer that asks the broker every 250 ms overlaps itself); asked only for a partition
        that has not been fetched yet."""
        out: dict[TP, int] = {}
        missing = []
        for tp in tps:
            try:
                hw = self.app.consumer.highwater(tp)
            except Exception:
                hw = None
            if hw is None or hw < 0:
                missing.append(tp)
            else:
                out[tp] = int(hw)
        if missing:
            out.update({tp: int(v or 0) for tp, v in (await self.app.consumer.highwaters(*missing)).items()})
        return out

    def _rebuild_index(self, assigned: frozenset[int]) -> None:
        n = self.s.kafka.partitions
        self.index.rebuild(
            ((key, table_value.due_of_value(value)) for key, value in self.table.items()),
            assigned,
            lambda key: partition_for(key.encode(), n),
        )
        # Everything before a partition's committed offset was folded before the commit (faust
        # commits after processing): count it as processed, or a partition with nothing new to
        # read would look lagging for ever, to lookups and to the deadline gate.
        for p in assigned:
            self.processed[p] = self.folded_through(p)
            self.processed_decisions[p] = self.folded_through(p, self.decisions.get_topic_name())
        log.info("deadline index rebuilt: %d open effects on partitions %s", len(self.index), sorted(assigned))
        # The changelog as recovered: this worker's next record of each partition is expected just
        # after it (another writer's record before it is a late one: ``_answer_foreign``). Without a
        # recorded offset (the memory store; an empty changelog), from its first record on.
        for p in assigned:
            held = faust_internals.persisted_changelog_offset(self.table, p)
            if held is not None:
                self.out.expect(p, held + 1)

    def folded_through(self, partition: int, topic: str | None = None) -> int:
        """The last offset of ``effects.events[partition]`` (or of ``topic``: effects.decisions)
        known to be in the table: what this worker folded, or what the group committed (faust
        commits only after processing)."""
        events = self.events.get_topic_name()
        topic = topic or events
        done = (self.processed if topic == events else self.processed_decisions).get(partition, -1)
        committed = faust_internals.committed_offset(self.app, topic, partition)
        return max(done, committed - 1) if committed is not None else done


class _App(faust.App):
    """faust's app, with the processor's last word before faust stops its consumer and tables
    (``on_stop``: mode's hook for a service's own stopping, which faust's docs say to extend)."""

    before_stop: Callable[[], Awaitable[None]] | None = None

    async def on_stop(self) -> None:
        if self.before_stop is not None:
            await self.before_stop()
        await super().on_stop()


class RawSchema(faust.Schema):
    """Records as they came, key and value bytes: what the ``raw`` serializers give, without faust's
    serializer registry in between (two look-ups per record the fetcher hands to the fold)."""

    def loads_key(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> Any:
        return message.key

    def loads_value(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> Any:
        return message.value


def _replication(k: KafkaConfig) -> int:
    if k.replication is None:
        raise ConfigError("the processor's replication factor is decided by the cluster: KafkaConfig.for_cluster")
    return k.replication


def faust_credentials(k: KafkaConfig) -> Any:
    """The SASL/SSL settings of ``KafkaConfig`` as faust credentials (aiokafka transport), so the
    processor authenticates like the confluent-kafka clients do."""
    proto = (k.security_protocol or "PLAINTEXT").upper()
    if proto == "PLAINTEXT":
        return None
    ssl_context = None
    if proto in ("SSL", "SASL_SSL"):
        import ssl

        ssl_context = ssl.create_default_context(cafile=k.ssl_cafile)
    if proto.startswith("SASL"):
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password,
            mechanism=(k.sasl_mechanism or "PLAIN").upper(),
            ssl_context=ssl_context,
        )
    return faust.SSLCredentials(ssl_context)
