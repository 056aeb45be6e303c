"""An agent names several processor workers for its lookups, and one that cannot answer does not
hold its calls (found by ``make chaos``).

Each agent host asked one worker, the one beside it. When that worker was paused, cut off from the
brokers or still recovering its table after a rebalance, it answered "rebalancing" or nothing at
all, and every call of that host waited for it for the whole ``sync_timeout`` (30 s): in a 4-minute
run one host completed no call for 31 s after a worker's pause had healed, while the other worker
owned and answered for every partition. Now a lookup goes to the worker that answered last, and
also to the next one when the first refuses for now or has not answered within ``HEDGE_S``.

Here: workers stood in by loopback servers that answer as a worker does (a 503 "lagging", no
answer at all, an answer), then two real workers on the broker with one of them frozen (SIGSTOP).
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from effect_ledger.demo.gateway import Gateway
from effect_ledger.errors import ConfigError, LedgerLagging, LedgerUnavailable
from effect_ledger.sdk.kafka.lookup import HEDGE_S, MAX_LOOKUP_URLS, SILENT_S, ProcessorLookup, lookup_urls
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.claim_agent import AgentProcess
from tests.faults.http_servers import LoopbackServer, Reply
from tests.sdk_contract import run
from tests.services import Processor, wait_for
from tests.topic_io import running

KEY = "k-1"
EVENT = b"\x00\x01"


def known(key: str = KEY) -> Reply:
    body = {"effect_id": key, "known": True, "events": [base64.b64encode(EVENT).decode()]}
    return Reply(200, json.dumps(body).encode())


def rebalancing() -> Reply:
    body = {
        "lagging": True,
        "reason": "the workers' group is rebalancing (a worker or the group's coordinator came or went)",
    }
    return Reply(503, json.dumps(body).encode())


def behind(partition: int = 0) -> Reply:
    body = {"lagging": True, "partition": partition, "high_watermark": 10, "processed": 3, "owned": True}
    return Reply(503, json.dumps(body).encode())


class _Worker(LoopbackServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a silent worker's late reply to a client that gave up on it: nobody reads it


@contextmanager
def workers(*answers: Callable[[str], Reply]) -> Iterator[list[LoopbackServer]]:
    """Loopback servers answering lookups; ``silent`` among the answers blocks until the test ends."""
    with ExitStack() as stack:
        stack.callback(_RELEASE.set)
        _RELEASE.clear()
        yield [stack.enter_context(_Worker(a)) for a in answers]


_RELEASE = threading.Event()


def silent(path: str) -> Reply:
    """A paused worker: the connection opens (the kernel accepts it), no answer comes."""
    _RELEASE.wait(120)
    return Reply(503, b"{}")


def ask(lookup: ProcessorLookup, times: int = 1, within: float = 30) -> list[list[bytes]]:
    """``times`` lookups of KEY in a row, each within ``within`` s (else TimeoutError: the test
    fails), then the lookup closed."""

    async def go() -> list[list[bytes]]:
        try:
            out = []
            for _ in range(times):
                async with asyncio.timeout(within):
                    out.append(await lookup.events(KEY))
            return out
        finally:
            await lookup.close()

    return run(go())


def test_a_worker_that_refuses_for_now_is_passed_over_and_the_answering_one_asked_first_next_time() -> None:
    with workers(lambda _p: rebalancing(), lambda _p: known()) as (w1, w2):
        lookup = ProcessorLookup([w1.url, w2.url], hedge_s=30)  # no second request for want of time
        first, second = ask(lookup, times=2)
    assert first == second == [EVENT]
    assert len(w1.seen) == 1, "the second lookup went to the worker that answered"
    assert len(w2.seen) == 2


def test_a_silent_worker_is_passed_over_after_the_hedge_not_the_lookup_timeout() -> None:
    with workers(silent, lambda _p: known()) as (w1, w2):
        # Without a second request the lookup would wait for the silent worker for 60 s.
        lookup = ProcessorLookup(f"{w1.url},{w2.url}", timeout=60)
        t = time.monotonic()
        [events] = ask(lookup, within=20)
        took = time.monotonic() - t
    assert events == [EVENT]
    assert took >= HEDGE_S * 0.9, "the second worker was asked only once the first had been given HEDGE_S"
    assert [len(w1.seen), len(w2.seen)] == [1, 1]


def test_a_silent_worker_is_given_up_on_when_the_others_refused_for_now() -> None:
    """The first worker is paused, the second rebalances: the lookup ends once the silent one has
    had SILENT_S, not its whole request timeout, so the caller asks again soon."""
    with workers(silent, lambda _p: rebalancing()) as (w1, w2):
        lookup = ProcessorLookup([w1.url, w2.url], timeout=60)
        with pytest.raises(LedgerLagging) as e:
            ask(lookup, within=SILENT_S + 10)
    assert e.value.passing
    assert f"{w1.url} did not answer in {SILENT_S:g} s" in str(e.value) and "rebalancing" in str(e.value)


def test_a_refusal_that_will_not_pass_ends_the_lookup_while_a_silent_worker_is_still_asked() -> None:
    with workers(silent, lambda _p: Reply(401, b"{}")) as (w1, w2):
        lookup = ProcessorLookup([w1.url, w2.url], timeout=60)
        with pytest.raises(LedgerUnavailable, match="401") as e:
            ask(lookup, within=SILENT_S)  # before the silent worker is given up on
    assert not e.value.passing


def test_three_workers_are_asked_two_at_a_time_and_the_third_after_one_is_given_up_on() -> None:
    with workers(silent, silent, lambda _p: known()) as (w1, w2, w3):
        lookup = ProcessorLookup([w1.url, w2.url, w3.url], timeout=60, hedge_s=0.2, silent_s=1.0)
        assert ask(lookup, within=20) == [[EVENT]]
    assert [len(w1.seen), len(w2.seen), len(w3.seen)] == [1, 1, 1]
    assert lookup.url == w3.url, "the next lookup begins with the worker that answered"


def test_when_no_worker_can_answer_the_error_is_lagging_and_gives_each_ones_reason() -> None:
    with workers(lambda _p: rebalancing(), lambda _p: behind()) as (w1, w2):
        lookup = ProcessorLookup([w1.url, w2.url])
        with pytest.raises(LedgerLagging) as e:
            ask(lookup)
    assert e.value.passing
    assert "rebalancing" in str(e.value) and "consumed through offset 3" in str(e.value)
    assert w1.url in str(e.value) and w2.url in str(e.value)


def test_a_refusal_that_will_not_pass_is_raised_at_once_not_asked_elsewhere() -> None:
    """A token refused (401) or an answer about another key is not "this worker cannot answer
    now": asking the next worker would hide a misconfiguration, or a wrong answer."""
    for first in (Reply(401, b"{}"), known("another-key")):
        with workers(lambda _p, r=first: r, lambda _p: known()) as (w1, w2):  # type: ignore[misc]
            lookup = ProcessorLookup([w1.url, w2.url], hedge_s=30)
            with pytest.raises(LedgerUnavailable) as e:
                ask(lookup)
        assert not e.value.passing
        assert w2.seen == [], "the second worker was asked"


@pytest.mark.parametrize(
    "bad",
    ["", " , ", "ftp://w1:6066", "http://", "w1:6066", "http://w1:6066/?a=1", "http://w1/#x", "http://w1:6066/?",
     "http://w1#", "http://w 1:6066", "http://w1\n:6066", "http://user:secret@w1:6066", ["http://w1", 3], b"http://w1",
     ",".join(f"http://w{i}:6066" for i in range(MAX_LOOKUP_URLS + 1)), "http://" + "w" * 3000, "," * 10**6],
)  # fmt: skip
def test_lookup_urls_refuse_what_is_not_a_list_of_worker_urls(bad: object, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        lookup_urls(bad)  # type: ignore[arg-type]
    assert "secret" not in str(e.value)
    db = tmp_path / "agent.db"
    with pytest.raises(ConfigError):
        run(Ledger.open(db, targets=[], lookup=bad))  # type: ignore[arg-type]
    assert not db.exists(), "the ledger file was created for a setting it refused"


def test_lookup_urls_accept_one_or_several_in_order_without_repeats() -> None:
    assert lookup_urls("http://w1:6066/") == ("http://w1:6066",)
    assert lookup_urls(" http://w2:6066 , https://w1/x,http://w2:6066") == ("http://w2:6066", "https://w1/x")
    assert lookup_urls(["http://w1:6066", "http://w2:6066"]) == ("http://w1:6066", "http://w2:6066")


# -- two real workers, one frozen -------------------------------------------------------------------


def _keys_on(partitions: set[int], n: int, total: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < n:
        k = f"lw-{uuid.uuid4().hex[:10]}"
        if partition_for(k.encode(), total) in partitions:
            keys.append(k)
    return keys


@pytest.mark.timeout(300)
def test_calls_complete_through_the_other_worker_while_the_first_named_one_is_frozen(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """The agent names the frozen worker first. Its keys on the live worker's partitions complete
    while the freeze lasts; with that worker alone (before), every one of them waited for it until
    ``sync_timeout`` and failed."""
    a = Processor(kafka_config, tmp_path / "data-a")
    b = Processor(kafka_config, tmp_path / "data-b")
    with Gateway("key+lookup") as gateway, running(a), running(b):
        a.wait_ready()
        b.wait_ready()

        def owned() -> set[int] | None:
            ha, hb = a.health() or {}, b.health() or {}
            pa, pb = set(ha.get("partitions") or ()), set(hb.get("partitions") or ())
            both = ha.get("ready") and hb.get("ready") and pa and pb
            return pb if both and len(pa | pb) == kafka_config.partitions else None

        b_owns = wait_for(owned, 120, "both workers to own partitions")
        keys = _keys_on(b_owns, 3, kafka_config.partitions)
        agent = AgentProcess(str(tmp_path / "host.db"), kafka_config, f"{a.url},{b.url}", gateway.url,
                             str(tmp_path / "host.log"))  # fmt: skip
        assert a.proc is not None
        try:
            a.proc.send_signal(signal.SIGSTOP)  # frozen until every call has its answer
            assert a.health() is None, "the frozen worker still answers"
            answers = []
            for k in keys:
                agent.send(f"execute {k}")
                answers.append(agent.answer(90))
        finally:
            a.proc.send_signal(signal.SIGCONT)
            agent.stop()
        made = {r.idempotency_key for r in gateway.refunds()}
    assert [x["outcome"] for x in answers] == ["called"] * len(keys), answers
    assert set(keys) <= made
