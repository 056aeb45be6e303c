"""faust's settings for the ledger processor, tuned for throughput (measured: without per-message
sensors, with larger fetches and buffers and a producer that lingers, the same fold runs ~1.5x).
All of it is faust's public configuration."""

from __future__ import annotations

from typing import Any

from faust.sensors import Monitor

#: Most events handed to one batch of the fold, and how long a batch waits to fill.
BATCH_MAX = 2000
BATCH_WITHIN_S = 0.005
#: How long the group waits for a silent worker before its partitions go to the others.
SESSION_TIMEOUT_S = 10.0
#: A worker folds only while the group's coordinator confirmed it a member less than this long ago
#: (``faust_internals.Membership``): its session then has at least the other half to run, time for
#: the batch to be written before the group can give its partitions to another worker.
MEMBER_FOR_S = SESSION_TIMEOUT_S / 2
#: How long the group waits for a member to rejoin during a rebalance (faust's default), and, by
#: default, how long a worker whose partitions are revoked, or that is told to stop, waits at most
#: for the batch it is writing (half of it: the consumer keeps heartbeating meanwhile, and the
#: rebalance waits for the member).
REBALANCE_TIMEOUT_S = 60.0
DRAIN_S = REBALANCE_TIMEOUT_S / 2
#: How long a heartbeat may go unanswered before the worker drops its connection to the group's
#: coordinator and looks the coordinator up again (``faust_internals.confirm_membership``): well
#: inside MEMBER_FOR_S, so a worker whose coordinator moved reaches the new one while its session
#: there still runs, instead of after the request timeout. A lookup of the coordinator gets as long.
HEARTBEAT_WAIT_S = 3.0
#: How long any other request of the worker's consumer may go unanswered, and a connection take to
#: open, before the connection is dropped and the request fails as timed out (aiokafka's own
#: handling, sooner: ``faust_internals.bound_requests``). A group join is the exception: it waits
#: for the whole group to rejoin, up to the rebalance timeout, under faust's request timeout.
REQUEST_WAIT_S = SESSION_TIMEOUT_S
#: A fetch's answer, sooner: faust's consumer asks the broker to hold a fetch for at most 1.5 s
#: when it has nothing new (``fetch_max_wait_ms``, fixed in faust's driver), so a fetch unanswered
#: for twice that went to a leader that stopped answering (paused, cut off), and the partitions it
#: led are read from nowhere until the connection is dropped and their new leader looked up: for
#: the whole request wait, the partitions' intents were not folded and every call on them waited.
FETCH_WAIT_S = 3.0
CONNECT_WAIT_S = SESSION_TIMEOUT_S / 2
#: How often the worker's consumer (and faust's producer, which sends the timer's commands) reads
#: the cluster's metadata again, from every broker, keeping what most of them say
#: (``faust_internals.majority_metadata``): a broker cut off from the other brokers but not from
#: the worker goes on answering its fetches as the leader of partitions the controllers have
#: moved, with nothing new and no error, so only a fresh read of the metadata moves the consumer
#: to their new leaders (faust's default: every 5 minutes).
METADATA_MAX_AGE_S = 3.0
#: How long each broker gets to answer that read (a live broker answers at once).
METADATA_WAIT_S = 2.0


class QuietMonitor(Monitor):
    """faust's Monitor without its per-message and per-table-access bookkeeping (statistics that
    only faust's own web pages show, which the processor does not serve). Kept: what the consumer
    itself reads from the monitor (end offsets, commits)."""

    def on_message_in(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_stream_event_in(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_stream_event_out(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_message_out(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_table_get(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_table_set(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_table_del(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_send_initiated(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def on_send_completed(self, *args: Any, **kwargs: Any) -> None:
        return None


def throughput_settings() -> dict[str, Any]:
    """The ``faust.App`` keyword arguments that make it fold faster."""
    return {
        "Monitor": QuietMonitor,
        "broker_max_poll_records": 5000,
        "consumer_max_fetch_size": 4 << 20,  # per partition
        "stream_buffer_maxsize": 16384,
        "producer_linger": 0.01,
        "producer_max_batch_size": 256 << 10,
        # A table value is at most MAX_TABLE_VALUE_BYTES (900,000): one record must fit a request.
        "producer_max_request_size": 1_000_000,
        # A worker killed without leaving the group (kill -9, a lost host) holds its partitions until
        # the broker gives up on its heartbeats: faust's default of 60 s left every partition of the
        # group unfolded for 60-105 s in the soak (make soak). Heartbeats come from the consumer's
        # own thread, so a busy fold does not miss them.
        "broker_session_timeout": SESSION_TIMEOUT_S,
        "broker_rebalance_timeout": REBALANCE_TIMEOUT_S,
        "broker_heartbeat_interval": SESSION_TIMEOUT_S / 5,
        "consumer_metadata_max_age_ms": int(METADATA_MAX_AGE_S * 1000),
        "producer_metadata_max_age_ms": int(METADATA_MAX_AGE_S * 1000),  # the timer's commands
    }
