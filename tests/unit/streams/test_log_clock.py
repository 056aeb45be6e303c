"""The log's time as one process knows it (``streams/log_clock.py``): the newest append time seen
plus the monotonic time since; never the host's wall clock once a log time is known."""

from __future__ import annotations

from types import SimpleNamespace

from effect_ledger.streams.log_clock import LOG_APPEND_TIME, LogClock, log_time_of, log_time_of_message


class Fake:
    def __init__(self) -> None:
        self.wall = 5_000_000  # this host's wall clock: two hours ahead of the log's below
        self.mono = 100.0

    def wall_ms(self) -> int:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


def test_before_any_log_time_the_wall_clock_is_all_there_is() -> None:
    f = Fake()
    c = LogClock(f.wall_ms, f.monotonic)
    assert not c.known and c.now() == 5_000_000 and c.skew_ms() is None


def test_the_log_time_then_advances_with_the_monotonic_clock_not_the_wall_clock() -> None:
    f = Fake()
    c = LogClock(f.wall_ms, f.monotonic)
    c.observe(1_000)
    assert c.known and c.now() == 1_000
    f.mono += 2.5
    f.wall += 7_200_000  # the wall clock jumps: the log's time does not
    assert c.now() == 3_500
    assert c.skew_ms() == f.wall - 3_500


def test_an_older_record_does_not_move_it_back_a_newer_one_moves_it_on() -> None:
    f = Fake()
    c = LogClock(f.wall_ms, f.monotonic)
    c.observe(10_000)
    f.mono += 1.0
    c.observe(9_000)  # a record appended earlier, read now (a backlog): the estimate stays
    assert c.now() == 11_000
    c.observe(20_000)  # the broker's clock is the authority: a newer append time wins
    assert c.now() == 20_000


def test_only_a_time_the_broker_stamped_is_a_log_time() -> None:
    import confluent_kafka

    assert LOG_APPEND_TIME == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
    assert log_time_of(LOG_APPEND_TIME, 1_234) == 1_234
    # CreateTime: the producer's clock, a writer's claim
    assert log_time_of(confluent_kafka.TIMESTAMP_CREATE_TIME, 1_234) is None
    assert log_time_of(LOG_APPEND_TIME, -1) is None and log_time_of(None, None) is None
    # aiokafka and faust number them as Kafka does: 0 CreateTime, 1 LogAppendTime; seconds
    assert log_time_of_message(SimpleNamespace(timestamp=1.234, timestamp_type=1)) == 1_234
    assert log_time_of_message(SimpleNamespace(timestamp=1.234, timestamp_type=0)) is None
