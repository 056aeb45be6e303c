"""Every access to faust-streaming's private parts, in one place, pinned to the version they were
read from. ``tests/unit/processors/test_faust_internals.py`` has one test per access: an upgrade that moves any
of them fails there, loudly, instead of somewhere in the processor.

Why each is needed (faust 0.15.3 has no public way):

* ``as_current_event``: a table read or write goes to the RocksDB partition and the changelog
  partition of faust's *current event* (``faust.streams._current_event``). A batch from
  ``take_events`` mixes partitions, so each key is written with its own last event made current.
  Reads outside the fold (lookups, the timer) run with no current event (``no_current_event``), so
  the store finds a key in whichever partition holds it, whatever event the calling task's context
  happens to carry.
* ``committed_offset``: where the group's committed offset put a partition after a rebalance
  (``Consumer._committed_offset``); everything before it was folded before the commit.
* ``peer_urls``: the web URLs of the group's workers, from the assignor (``_tps_url``), to forward
  a lookup to the owner of a key's partition of effects.events.
* ``hold_fetching_until_streams_resume``: relies on the order of faust's
  ``Recovery.on_recovery_completed`` (table recover callbacks, then resume the source partitions,
  seek them to their committed offsets, clear the stream buffers, resume the consumer's flow).
  Between the resume and the clear, the fetcher hands records of the resumed partitions to the
  streams, and the clear drops them; a partition with a committed offset is sought back and reads
  them again, but one without (its previous worker was killed before its first commit) is not: its
  position has moved past them, and the worker never folds them (a restart that "processed
  nothing"). Stopping the consumer's flow from the recover callback keeps the fetcher from taking
  records until faust resumes the flow, after the clear. A fetch already under way when the flow
  stops still returns records; faust drops them and seeks back (``seek_uncommitted_to_start``
  makes that seek right for a partition without a commit too).
* ``seek_uncommitted_to_start``: faust's one way back to "where the group stands" is
  ``Consumer.perform_seek``, which calls ``seek_to_committed``. It runs after every table recovery,
  and again whenever records come back from a fetch while the consumer's flow is stopped (faust
  drops those records, the fetch position having moved past them: ``Consumer.getmany``). aiokafka's
  ``seek_to_committed`` leaves a partition without a committed offset (or with 0) where it is, so a
  partition nobody has committed yet (its previous worker was stopped before its group's first
  commit, or a new group) kept the position past the dropped records: a worker that rebuilt its
  table from the changelog then folded nothing at all. The consumer's ``seek_to_committed`` is
  wrapped, on the instance, so that it also puts such partitions of the source topics back at their
  first record: the group's policy for a partition without a commit ("earliest"), said every time
  faust goes back, not once. Reading a record twice is harmless (the fold ignores an event id it
  holds); skipping one is not.
* ``leave_unacknowledged``: an event a worker does not fold (its partition was revoked while the
  event waited in the take buffer) must not be acknowledged: ``take_events`` acknowledges every
  event of a batch once the batch returns, and faust would record the offset as processed. After the
  revocation faust has dropped its bookkeeping of the partition, so the record stays; if the
  partition comes back to this worker, a commit could then pass events it never folded. faust
  counts an offset when a message's last reference is acknowledged (``Message.ack`` ->
  ``on_final_ack`` -> ``Consumer.ack``), and does nothing for a message already marked ``acked``.
* ``table_partitions``: the table's store per partition (``Store._db_for_partition``), so a batch's
  values are written as one RocksDB write batch per partition (``batch_writer``) and read from it
  without faust's layers (``table_reader``: the fold reads every key it has not cached), and the
  store's record of the last changelog offset it holds (``set_persisted_offset``). The memory store
  (``--store memory://``) keeps decoded keys in a dict (``Store.data``).
* ``open_databases``: the RocksDB databases a table's store has open (``Store._dbs``, partition ->
  database), for RocksDB's own counts of its memory (``rocks.memory``): the worker's health view.
* ``quick_handoff``: faust's fetcher hands each record to the streams with
  ``Consumer.wait_first(callback(message), suspend_flow.wait())`` (``Consumer._drain_messages``):
  four tasks, an ``asyncio.wait`` and three cancellations per record, most of the loop's work on a
  busy worker, when the callback nearly always finishes at once (it puts the event in a stream's
  buffer). The consumer's ``wait_first`` is replaced, for that call only, by one that runs the
  callback until it first waits: done (the common case), nothing else is made; waiting (a full
  buffer), it goes on under faust's own ``wait_first``, which still gives up on it when the flow is
  suspended or the consumer stops. faust's version runs the callback's first step before any
  other too (its task is made first), so nothing happens in another order.
* ``rewind_dropped_fetches``: faust drops the records a fetch returns while the consumer's flow is
  stopped (``Consumer.getmany``, then ``perform_seek``, which puts the *source* partitions back at
  their commits and nothing else), and aiokafka's position has already moved past them. A long poll
  (faust asks for 1 s) started before a rebalance can come back between the recovery's seek of a
  changelog partition and faust's "Resuming flow", with that partition's records from the
  recovery's start: dropped, the changelog read to its end, and the recovery waited for them for
  ever ("No event received for active tp", the worker never ready). The consumer's
  ``_wait_next_records`` is wrapped on the instance: such records are not handed to faust, and each
  partition they came from is put back at the first of them, on the consumer's thread, only if its
  position is still where that fetch left it (a seek since, the recovery's or faust's, wins). Where
  the fetch left it is read on the consumer's thread as the fetch returns (the consumer thread's
  ``_fetch_records``, wrapped): past a compacted batch's end or a transaction marker it is not the
  last record's offset + 1. Positions are read from aiokafka's subscription state
  (``AIOKafkaConsumer._subscription``), aiokafka's own record of them, without ``position()``'s
  wait for one.
* ``confirm_membership``: a worker cut off from the group's coordinator (or paused) keeps believing
  it owns its partitions until a heartbeat's answer says otherwise, and aiokafka waits for a
  heartbeat sent into the cut up to the request timeout (90 s): meanwhile the group gave its
  partitions to another worker, while this one's fetches and writes still go through once the
  network heals, folding records after their owner and writing older table values after its newer
  ones. aiokafka says nothing public of when the coordinator last confirmed the membership, so the
  consumer's group coordinator (``AIOKafkaConsumer._coordinator``) is wrapped on the instance:
  ``_on_join_complete`` (a join's SyncGroup answered: the coordinator restarted the member's
  session), ``_do_heartbeat`` (True: answered for the member's generation, timed from when it was
  sent) and ``reset_generation`` (the member is no longer one). The heartbeat is also given
  ``HEARTBEAT_WAIT_S`` for its answer: after a cut heals, the connection it went out on can stay
  silent for tens of seconds (TCP backs off its retransmissions) while a new one goes through at
  once, and when the coordinator moved, its answer never comes. Past that wait the connection is
  closed as timed out and the coordinator marked dead (``GroupCoordinator.coordinator_dead``), so
  the heartbeat routine looks it up again and heartbeats on a new connection while the session
  still runs, instead of after the request timeout, when the group has rebalanced without it.
* ``bound_requests``: the same for every other request of the worker's consumer (aiokafka's client,
  ``AIOKafkaConsumer._client``): its ``send`` and ``_get_conn`` are wrapped on the instance, so a
  request unanswered after ``REQUEST_WAIT_S`` closes its connection and fails as timed out, which
  is what aiokafka does at the request timeout, and a connection that takes ``CONNECT_WAIT_S`` to
  open counts as failed, as aiokafka counts a refused one. Without them a fetch, a coordinator
  lookup or a metadata read sent into a cut waited 90 s, and a connect into one held the client's
  only connection lock (``_get_conn_lock``) as long. A fetch gets less (``FETCH_WAIT_S``): the
  broker holds one for at most faust's 1.5 s, so one unanswered for longer has a silent leader,
  and until its connection is dropped the partitions it led are not read (a broker paused 12 s
  held them for the 10 s of the request wait). A group join keeps faust's request timeout:
  the coordinator answers it only when the whole group has rejoined, up to the rebalance timeout.
  A coordinator lookup (FindCoordinator) gets ``HEARTBEAT_WAIT_S``, and goes to a broker chosen
  at random (``get_random_node``, its one caller on a consumer's client), which is wrapped to
  leave out, for a while, a broker that just failed to answer or to connect: a paused broker was
  asked again one time in three, and held the lookup until the session had run out.
* ``majority_metadata``: a broker cut off from the other brokers (and so from the controllers) but
  not from its clients keeps answering them from its last view of the cluster: itself the leader of
  partitions whose leadership the controllers have since moved, fetches answered with nothing new
  and no error. aiokafka (0.14, metadata up to v5, no leader epochs) replaces its whole view with
  whatever one broker, chosen at random, answers, so the consumer kept fetching the moved partitions
  from the cut broker until the cut healed, and those partitions' intents were not folded: every
  call on them failed, the other partitions' calls completed (a 25 s cut: 40-60% of calls failed
  throughout). The client's metadata read (``_metadata_update``, what aiokafka's refresh task runs)
  is replaced on the instance: every broker the client knows is asked at once, each for at most
  ``METADATA_WAIT_S``, and the answer kept is the one most answers agree with, partition by
  partition (``majority_answer``). The refresh itself comes every ``METADATA_MAX_AGE_S`` (faust's
  public ``consumer_metadata_max_age_ms``), since nothing else tells the consumer that a silent
  leader is stale.
* ``refused_authorization``: faust's crash keeps the Kafka client's own exception (aiokafka's
  ``TopicAuthorizationFailedError`` carries the refused topics as its first argument), the only
  place that says which right the ACLs took away when a commit or fetch is refused.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
import types
import weakref
from collections.abc import Callable, Coroutine, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import faust
import faust.streams
from aiokafka.client import ConnectionGroup
from aiokafka.conn import CloseReason
from aiokafka.errors import IllegalStateError, KafkaError, RequestTimedOutError
from aiokafka.protocol.metadata import MetadataRequest
from faust.types import TP

log = logging.getLogger(__name__)

#: The faust-streaming release the accesses below were read from (DEPENDENCIES.md: use it exactly).
FAUST_VERSION = "0.15.3"
#: The aiokafka release ``rewind_dropped_fetches`` read the subscription state from.
AIOKAFKA_VERSION = "0.14.0"


class as_current_event:  # noqa: N801 - used like the context manager function it replaced
    """Make ``event`` faust's current event for the block (the partition tables read and write).
    A class rather than a ``contextmanager`` generator: the fold enters one per key."""

    __slots__ = ("_event", "_token")

    def __init__(self, event: Any) -> None:
        self._event = event

    def __enter__(self) -> None:
        self._token = faust.streams._current_event.set(weakref.ref(self._event))

    def __exit__(self, *exc: object) -> None:
        faust.streams._current_event.reset(self._token)


@contextmanager
def no_current_event() -> Iterator[None]:
    """No current event for the block: the table looks a key up in every partition it holds."""
    token = faust.streams._current_event.set(None)
    try:
        yield
    finally:
        faust.streams._current_event.reset(token)


def committed_offset(app: faust.App, topic: str, partition: int) -> int | None:
    """The committed offset faust sought to for ``topic[partition]`` on assignment (None: unknown)."""
    offsets = getattr(app.consumer, "_committed_offset", None)
    if offsets is None:
        return None
    value = offsets.get(TP(topic, partition))
    return None if value is None else int(value)


def leave_unacknowledged(event: Any) -> None:
    """faust will not count ``event``'s offset as processed when its stream acknowledges it: the
    next owner of its partition reads it again from the group's committed offset."""
    event.message.acked = True


def seek_uncommitted_to_start(app: faust.App, topics: frozenset[str]) -> None:
    """Make faust's seeks back to the committed offsets put a partition of ``topics`` that has no
    committed offset back at its first record (module docstring). Idempotent; call before the
    first assignment's recovery ends (the processor calls it from ``on_rebalance_complete``)."""
    consumer: Any = app.consumer
    if getattr(consumer, "_effect_ledger_seek_uncommitted", False):
        return
    original = consumer.seek_to_committed

    async def seek_to_committed() -> Any:
        committed = await original()
        fresh = [tp for tp, offset in committed.items() if tp.topic in topics and not offset]
        if fresh:
            earliest = await consumer.earliest_offsets(*fresh)
            assigned = consumer.assignment()  # a rebalance may have taken some away meanwhile
            try:
                await consumer.seek_wait({tp: int(earliest.get(tp) or 0) for tp in fresh if tp in assigned})
            except IllegalStateError:  # taken away during the seek: the next assignment seeks again
                pass
        return committed

    consumer.seek_to_committed = seek_to_committed
    consumer._effect_ledger_seek_uncommitted = True


class _Fetched(dict[Any, Any]):
    """A fetch's records, with where aiokafka put each partition's position as the fetch returned
    (past the last record, or past a batch end or a transaction marker after it)."""

    ends: dict[Any, int]


def rewind_dropped_fetches(app: faust.App) -> None:
    """Never let faust drop fetched records without putting their partitions back where those
    records began (module docstring). Idempotent; call once the app's consumer exists."""
    consumer: Any = app.consumer
    if getattr(consumer, "_effect_ledger_rewind", False):
        return
    thread = consumer._thread
    fetch = thread._fetch_records

    async def fetch_records(aio: Any, *args: Any, **kwargs: Any) -> Any:
        # On the consumer's thread: the positions are read as the fetch returns, before anything
        # else runs there (a seek).
        records = await fetch(aio, *args, **kwargs)
        if not records:
            return records
        fetched = _Fetched(records)
        fetched.ends = positions(aio, fetched)
        return fetched

    original = consumer._wait_next_records

    async def wait_next_records(timeout: float) -> Any:
        records, active = await original(timeout)
        if records and not consumer.flow_active:
            # faust would drop these (its getmany checks the flow after the fetch): hand it none,
            # and fetch them again once a partition is read from where it stands.
            ends = getattr(records, "ends", {})
            spans = {tp: (batch[0].offset, ends[tp]) for tp, batch in records.items() if batch and tp in ends}
            try:
                await thread.call_thread(rewind_unmoved, thread._ensure_consumer(), spans)
            except Exception as e:  # stopping: faust's own seek back after a drop only logs too
                log.warning("could not put fetched partitions back where their dropped records began: %r", e)
            return {}, active
        return records, active

    thread._fetch_records = fetch_records
    consumer._wait_next_records = wait_next_records
    consumer._effect_ledger_rewind = True


def positions(aio: Any, partitions: Any) -> dict[Any, int]:
    """aiokafka's position of each of ``partitions`` that has one, read from its subscription state
    (``position()`` would wait for a partition that has none)."""
    subscription = aio._subscription.subscription
    assignment = subscription.assignment if subscription is not None else None
    if assignment is None:
        return {}
    found = {}
    for tp in partitions:
        if tp in assignment.tps:
            state = assignment.state_value(tp)
            if state.has_valid_position:
                found[tp] = state.position
    return found


async def rewind_unmoved(aio: Any, spans: dict[Any, tuple[int, int]]) -> list[Any]:
    """On the consumer's thread: put each partition back at ``first`` if aiokafka's position for
    it is still ``end``, where the fetch that returned from ``first`` on left it (nothing sought it
    since; a partition revoked meanwhile is its next owner's). Nothing here waits, so no other seek
    runs between the look and the seek. Returns the partitions put back."""
    now = positions(aio, spans)
    rewound = []
    for tp, (first, end) in spans.items():
        if now.get(tp) == end:
            aio.seek(tp, first)
            rewound.append(tp)
    return rewound


class Membership:
    """When the group's coordinator last confirmed this worker a member (``heard``: monotonic
    seconds, None while it is not one), kept by ``confirm_membership``. The coordinator keeps a
    member for its session timeout after the last heartbeat that reached it, so a member heard less
    than that long ago cannot have been replaced yet."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.heard: float | None = None
        #: Counts joins and losses: the same epoch at two moments, with the worker confirmed a
        #: member at both, means it stayed the one member holding its partitions in between.
        self.epoch = 0

    def age(self) -> float | None:
        """Seconds since the coordinator last confirmed the membership (None: not a member)."""
        heard = self.heard  # read once: the consumer's thread may reset it meanwhile
        return None if heard is None else self.clock() - heard

    def confirmed(self, at: float) -> None:
        heard = self.heard
        self.heard = at if heard is None else max(heard, at)


def confirm_membership(app: faust.App, membership: Membership, heartbeat_wait_s: float) -> bool:
    """Keep ``membership`` told of what the group's coordinator says of this worker (module
    docstring), and give up on a heartbeat unanswered after ``heartbeat_wait_s``. Idempotent; call
    from faust's rebalance signals (the coordinator exists by then: it calls them): the revocation
    before a join, so that the join is heard as it completes. True when it was installed by this
    call (from an assignment: that join was missed, the caller counts it)."""
    consumer: Any = app.consumer
    coordinator = consumer._thread._consumer._coordinator
    if getattr(coordinator, "_effect_ledger_membership", None) is membership:
        return False
    join = coordinator._on_join_complete
    beat = coordinator._do_heartbeat
    reset = coordinator.reset_generation

    async def on_join_complete(*args: Any, **kwargs: Any) -> Any:
        membership.epoch += 1
        membership.confirmed(membership.clock())  # the SyncGroup answer just came
        return await join(*args, **kwargs)

    async def do_heartbeat() -> Any:
        sent, generation, node = membership.clock(), coordinator.generation, coordinator.coordinator_id
        try:
            ok = await asyncio.wait_for(beat(), heartbeat_wait_s)
        except TimeoutError:
            # The coordinator moved, or the way to it is cut: its answer, if it ever comes, comes
            # after the session it could confirm. Forget the connection (its requests fail, to be
            # sent again) and the coordinator: the heartbeat routine looks it up again at once.
            log.warning(
                "no answer to a heartbeat from the group's coordinator (node %s) in %.0f s: "
                "looking the coordinator up again",
                node,
                heartbeat_wait_s,
            )
            drop_connection(coordinator._client, node, ConnectionGroup.COORDINATION, heartbeat_wait_s * 3)
            coordinator.coordinator_dead()
            return False
        # True also while the group rebalances: the member stays one until it rejoins (and is
        # revoked first) or its rebalance timeout runs out (then a later heartbeat is refused).
        if ok and coordinator.generation == generation and membership.heard is not None:
            membership.confirmed(sent)
        return ok

    def reset_generation() -> Any:
        membership.epoch += 1
        membership.heard = None
        return reset()

    coordinator._on_join_complete = on_join_complete
    coordinator._do_heartbeat = do_heartbeat
    coordinator.reset_generation = reset_generation
    coordinator._effect_ledger_membership = membership
    return True


def drop_connection(client: Any, node: Any, group: Any, silent_s: float = 0.0) -> None:
    """Close the client's connection to ``node`` in ``group`` as timed out, as aiokafka does when a
    request runs past its timeout: every request waiting on it fails, the next one connects anew.
    With ``silent_s`` (and ``bound_requests`` installed), ``node`` is the last broker asked where
    the group's coordinator is for that long."""
    conn = client._conns.get((node, group))
    if conn is not None:
        conn.close(reason=CloseReason.CONNECTION_TIMEOUT)
    silent = getattr(client, "_effect_ledger_silent", None)
    if silent is not None and silent_s > 0:
        silent[node] = time.monotonic() + silent_s


def bound_requests(
    app: faust.App, request_wait_s: float, connect_wait_s: float, lookup_wait_s: float, fetch_wait_s: float
) -> bool:
    """Give every request of the worker's consumer but a group join ``request_wait_s`` for its
    answer (a coordinator lookup ``lookup_wait_s``, a fetch ``fetch_wait_s``), and a new connection
    ``connect_wait_s`` to open; ask a broker that did not answer in time where the coordinator is
    only when no other can be asked (module docstring). Idempotent; True when installed by this
    call."""
    consumer: Any = app.consumer
    client = consumer._thread._consumer._client
    if getattr(client, "_effect_ledger_bounded", False):
        return False
    send = client.send
    get_conn = client._get_conn
    silent: dict[Any, float] = {}  # broker -> until when it is asked for the coordinator last

    async def bounded_send(node_id: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        key = getattr(request, "API_KEY", None)
        if key == _JOIN_GROUP:
            return await send(node_id, request, *args, **kwargs)
        wait = lookup_wait_s if key == _FIND_COORDINATOR else fetch_wait_s if key == _FETCH else request_wait_s
        try:
            return await asyncio.wait_for(send(node_id, request, *args, **kwargs), wait)
        except TimeoutError:
            group = kwargs.get("group", args[0] if args else ConnectionGroup.DEFAULT)
            log.warning(
                "no answer from broker %s to %s in %.0f s: dropping the connection",
                node_id,
                type(request).__name__,
                wait,
            )
            drop_connection(client, node_id, group, request_wait_s)
            raise RequestTimedOutError() from None

    async def bounded_get_conn(node_id: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.wait_for(get_conn(node_id, *args, **kwargs), connect_wait_s)
        except TimeoutError:
            # What aiokafka does when a connection fails: no connection, and metadata to refresh.
            log.warning("no connection to broker %s in %.0f s", node_id, connect_wait_s)
            silent[node_id] = time.monotonic() + request_wait_s
            client.force_metadata_update()
            return None

    def get_random_node() -> Any:
        # The one caller on a consumer's client is the coordinator lookup: a broker paused or cut
        # off would hold it for the whole wait again, one time in three with three brokers.
        nodes = [b.nodeId for b in client.cluster.brokers()]
        now = time.monotonic()
        answering = [n for n in nodes if silent.get(n, 0.0) <= now]
        pool = answering or nodes
        return random.choice(pool) if pool else None

    client.send = bounded_send
    client._get_conn = bounded_get_conn
    client.get_random_node = get_random_node
    client._effect_ledger_silent = silent
    client._effect_ledger_bounded = True
    return True


def _leaders(answer: Any) -> dict[tuple[str, int], int]:
    """(topic, partition) -> leader in a MetadataResponse (aiokafka's layouts: v0 has no
    ``is_internal``)."""
    out: dict[tuple[str, int], int] = {}
    for topic_data in answer.topics:
        topic, partitions = topic_data[1], topic_data[2 if answer.API_VERSION == 0 else 3]
        for partition_data in partitions:
            out[(topic, partition_data[1])] = partition_data[2]
    return out


def majority_answer(answers: list[Any]) -> Any:
    """Of several brokers' MetadataResponses, the one the others agree with most: per partition,
    how many answers name the same leader as it does, summed over its partitions. A broker cut off
    from the controllers answers from its last view, alone against the brokers that still follow
    them. A tie (two answers, one of them stale) goes to the answer that lists fewer brokers: the
    cluster leaves a fenced broker out of its answers, while the cut broker still lists itself;
    then to the first answer."""
    views = [_leaders(a) for a in answers]

    def score(i: int) -> tuple[int, int]:
        agree = sum(1 for part, leader in views[i].items() for view in views if view.get(part) == leader)
        return agree, -len(answers[i].brokers)

    return answers[max(range(len(answers)), key=score)]


def majority_metadata(app: faust.App, wait_s: float) -> int:
    """Make the worker's consumer, and faust's producer when it runs, read the cluster's metadata
    from every broker they know and keep the answer most of them agree with (module docstring).
    Idempotent; returns how many clients it was installed on by this call."""
    clients = [app.consumer._thread._consumer._client]  # type: ignore[attr-defined]
    producer = getattr(app.producer, "_producer", None)
    if producer is not None:
        clients.append(producer.client)
    return sum(_majority_metadata(client, wait_s) for client in clients)


def _majority_metadata(client: Any, wait_s: float) -> bool:
    if getattr(client, "_effect_ledger_majority", False):
        return False
    original = client._metadata_update

    # A broker that did not answer (here, or a request or connect of ``bound_requests``) is left
    # out for a while: a connect to it would hold the client's connection lock every 3 s, and the
    # others' answers are enough (the cluster drops it from them once it is fenced).
    silent: dict[Any, float] | None = getattr(client, "_effect_ledger_silent", None)  # shared with it
    if silent is None:
        silent = {}

    async def ask(node_id: Any, request: Any) -> Any:
        try:
            return await asyncio.wait_for(client.send(node_id, request), wait_s)
        except (KafkaError, TimeoutError, OSError) as e:
            log.debug("no metadata from broker %s: %r", node_id, e)
            silent[node_id] = time.monotonic() + 3 * wait_s
            return None

    async def metadata_update(cluster_metadata: Any, topics: Any) -> bool:
        known = [b.nodeId for b in client.cluster.brokers()]
        if len(known) < 2 or ("bootstrap", ConnectionGroup.DEFAULT) in client._conns:
            return bool(await original(cluster_metadata, topics))  # nothing to compare yet
        now = time.monotonic()
        nodes = [n for n in known if silent.get(n, 0.0) <= now] or known
        request = MetadataRequest(list(topics) if topics else None)
        answers = [a for a in await asyncio.gather(*(ask(n, request) for n in nodes)) if a is not None and a.brokers]
        if not answers:
            log.error("no metadata from any of brokers %s", nodes)
            cluster_metadata.failed_update(None)
            return False
        cluster_metadata.update_metadata(majority_answer(answers))
        return True

    client._metadata_update = metadata_update
    client._effect_ledger_majority = True
    return True


_JOIN_GROUP = 11  # the Kafka protocol's API keys of JoinGroup, FindCoordinator and Fetch
_FIND_COORDINATOR = 10
_FETCH = 1


def hold_fetching_until_streams_resume(app: faust.App) -> None:
    """Call from a table's recover callback: the fetcher takes no records until faust resumes the
    consumer's flow at the end of ``on_recovery_completed`` (see the module docstring)."""
    app.consumer.stop_flow()


class _DictBatch(list[tuple[bytes, bytes]]):
    def put(self, key: bytes, value: bytes) -> None:
        self.append((key, value))


class _DictPartition:
    """The memory store seen as a RocksDB partition: it keys its dict by the decoded key."""

    def __init__(self, table: Any) -> None:
        self._data = table.data.data
        self._table = table

    def write(self, batch: _DictBatch) -> None:
        t = self._table
        for key, value in batch:
            self._data[t.app.serializers.loads_key(t.key_type, key, serializer=t.key_serializer)] = value


def table_partitions(table: Any) -> tuple[Callable[[int], Any], Callable[[], Any]]:
    """(partition -> the table's store of that partition, a new empty write batch) for ``table``
    (keys: ``table_key``; values: the table's raw bytes)."""
    store = table.data
    if hasattr(store, "_db_for_partition"):  # rocksdb:// (the rocksdict driver)
        import rocksdict

        return store._db_for_partition, lambda: rocksdict.WriteBatch(raw_mode=True)
    partition = _DictPartition(table)  # memory://
    return (lambda _p: partition), _DictBatch


def table_reader(table: Any) -> Callable[[int, bytes], bytes | None]:
    """(partition, ``table_key``) -> the value the table holds for the key in that partition, or
    None: what ``table.get`` reads with an event of that partition current (``Store._get``),
    without faust's layers around it (``Store.data`` for the memory store)."""
    store = table.data
    if hasattr(store, "_db_for_partition"):  # rocksdb://
        db_for = store._db_for_partition
        return lambda partition, key: db_for(partition).get(key)
    data = store.data  # memory://: keyed by the decoded key
    serializers = table.app.serializers

    def read(_partition: int, key: bytes) -> bytes | None:
        value = data.get(serializers.loads_key(table.key_type, key, serializer=table.key_serializer))
        return None if value is None else bytes(value)

    return read


def open_databases(store: Any) -> list[Any]:
    """The RocksDB databases ``store`` (a table's ``rocksdb://`` store) has open, one a partition
    it holds (none for another kind of store)."""
    return list(getattr(store, "_dbs", {}).values())


def table_key(table: Any, key: str) -> bytes:
    """The bytes ``table`` stores ``key`` under (and sends as the changelog record's key)."""
    return bytes(table.app.serializers.dumps_key(table.key_type, key, serializer=table.key_serializer))


def persist_changelog_offset(table: Any, partition: int, offset: int) -> None:
    """Remember in the store the last changelog offset written for ``partition`` (faust recovers a
    partition's changelog from there)."""
    table.data.set_persisted_offset(TP(table.changelog_topic.get_topic_name(), partition), offset)


def persisted_changelog_offset(table: Any, partition: int) -> int | None:
    """The last changelog offset of ``partition`` the store holds (what a recovery read to, or
    ``persist_changelog_offset`` recorded); None for the memory store, which records none."""
    offset = table.data.persisted_offset(TP(table.changelog_topic.get_topic_name(), partition))
    return None if offset is None else int(offset)


def peer_urls(app: faust.App) -> set[str]:
    """The web URLs of every worker of the group (this one included), as the assignor knows them."""
    return {str(u) for u in app.assignor._tps_url.values()}  # type: ignore[attr-defined]


class _Resumed:
    """A coroutine already run to where it first waits (on ``waiting``), awaitable from there on:
    what ``yield from`` does, for a coroutine whose first step ran outside any task."""

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self._coro = coro
        self._waiting = waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting = self._coro, self._waiting
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # a cancellation, thrown into the task: into the coroutine
                try:
                    waiting = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


_EVENT_WAIT = asyncio.Event.wait.__code__  # the consumer's suspend_flow is an asyncio.Event


def _is_handoff(consumer: Any, coros: tuple[Any, ...], timeout: Any) -> bool:
    """``wait_first(callback(message), self.suspend_flow.wait())`` in ``Consumer._drain_messages``."""
    return (
        timeout is None
        and len(coros) == 2
        and isinstance(coros[0], types.CoroutineType)
        and getattr(coros[1], "cr_code", None) is _EVENT_WAIT
        and inspect.getcoroutinestate(coros[0]) == inspect.CORO_CREATED
        and inspect.getcoroutinestate(coros[1]) == inspect.CORO_CREATED
        and coros[1].cr_frame.f_locals.get("self") is consumer.suspend_flow
    )


def quick_handoff(app: faust.App) -> None:
    """Make the fetcher's hand-off of a record to the streams cheap (module docstring). Idempotent."""
    consumer: Any = app.consumer
    if getattr(consumer, "_effect_ledger_quick_handoff", False):
        return
    original = consumer.wait_first

    async def wait_first(*coros: Any, timeout: Any = None) -> Any:
        if not _is_handoff(consumer, coros, timeout):
            return await original(*coros, timeout=timeout)
        callback, suspended = coros
        try:
            waiting = callback.send(None)
        except StopIteration:  # handed off without waiting: what faust's version returns is not read
            suspended.close()
            return None
        except BaseException:
            suspended.close()
            raise
        return await original(_Resumed(callback, waiting), suspended)

    consumer.wait_first = wait_first
    consumer._effect_ledger_quick_handoff = True


def refused_authorization(error: BaseException) -> tuple[str, tuple[str, ...]] | None:
    """An authorization refusal of faust's Kafka client (aiokafka) in ``error``'s chain (its cause
    or context, and theirs): ``("topic", names)`` (sorted; empty when the broker did not name them)
    or ``("group", ())``; None when there is none."""
    from aiokafka import errors as ak

    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ak.TopicAuthorizationFailedError):
            # A set from the offset commit and the sender, one name from the fetcher and metadata.
            arg = e.args[0] if e.args else ()
            named = (arg,) if isinstance(arg, str) else arg if isinstance(arg, set | frozenset | list | tuple) else ()
            return "topic", tuple(sorted(map(str, named)))
        if isinstance(e, ak.GroupAuthorizationFailedError):
            return "group", ()
        e = e.__cause__ or e.__context__
    return None
