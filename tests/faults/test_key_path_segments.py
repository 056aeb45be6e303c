"""Issue 10, item 2: keys that are path segments. The key rule accepted a caller key ``..``, and
URL quoting leaves dots alone, so ``/refunds/by-key/..`` became ``/refunds/`` (404 -> ABSENT -> a
second refund) and the processor lookup ``/effects/..`` became ``/`` (faust's index answers 200
``{"status": "OK"}``, read as "unknown key" -> another host executes again). And the lookup client
believed any 200/404 answer, whichever effect (if any) it named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from effect_ledger.core.keys import check_key
from effect_ledger.core.reconcile import EffectView, Found, Target
from effect_ledger.demo.client import GatewayClient
from effect_ledger.demo.gateway import Gateway
from effect_ledger.errors import InvalidEffect, LedgerUnavailable
from effect_ledger.sdk.kafka.lookup import ProcessorLookup
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.targets.http import HttpReconciler
from tests.faults.http_servers import LoopbackServer, Reply
from tests.sdk_contract import run

T0 = 1_700_000_000_000
DOTS = [".", "..", "..."]


def view(key: str) -> EffectView:
    return EffectView(key, "payments", "refund.create", {"order": "123", "amount": 4800}, 1, T0, T0 + 10_000)


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with Gateway("lookup") as gw:
        yield gw


# -- the encoding of a key in a URL path ----------------------------------------------------------------


@pytest.mark.parametrize("key", [*DOTS, "a/../b", "./x", "x/.", "%2E%2E", "a.b"])
def test_reconciler_looks_up_a_dot_key_as_itself_not_its_parent(gateway: Gateway, key: str) -> None:
    """A refund made with the key must be found by the key (keys made only of dots are refused for
    new effects, but the encoding must stay injective for anything a destination may be asked)."""
    gateway.state.reset()

    async def refund() -> dict[str, Any]:
        async with GatewayClient(gateway.url) as client:
            return await client.refund("123", 4800, idempotency_key=key)

    made = run(refund())
    answer = run(HttpReconciler(f"{gateway.url}/refunds/by-key/{{key}}", timeout=5).check(view(key)))
    assert answer == Found(made["id"], made), f"key {key!r}: {answer!r}"


def test_key_path_segment_is_injective_and_never_a_dot_segment() -> None:
    from effect_ledger.core.keys import key_path_segment

    keys = [*DOTS, "a.b", "a%2Eb", "%2E", "a/b", "a%2Fb", "~", "k-1_x", "payments:" + "ab" * 32]
    segments = [key_path_segment(k) for k in keys]
    assert len(set(segments)) == len(keys)  # injective on this sample ...
    for k, s in zip(keys, segments, strict=True):
        assert unquote(s) == k  # ... because it decodes back to the key
        assert "/" not in s and "." not in s  # one segment, and never "." or ".." after any decoding step
        assert s.strip(".") == s


def test_lookup_client_sends_a_dot_key_to_its_own_path() -> None:
    with LoopbackServer(lambda path: Reply(404, json.dumps({"effect_id": "..", "known": False}).encode())) as srv:
        lookup = ProcessorLookup(srv.url)
        try:
            run(_events(lookup, ".."))
        finally:
            run(lookup.close())
        assert [s.path for s in srv.seen] == ["/effects/%2E%2E"]


async def _events(lookup: ProcessorLookup, key: str) -> list[bytes]:
    try:
        return await lookup.events(key)
    finally:
        await lookup.close()


# -- keys made only of dots are refused ---------------------------------------------------------------


@pytest.mark.parametrize("key", DOTS)
def test_check_key_refuses_keys_made_only_of_dots(key: str) -> None:
    with pytest.raises(InvalidEffect, match="dots"):
        check_key(key)


def test_execute_with_a_dot_key_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    called: list[str] = []

    async def body() -> None:
        async with await Ledger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
            with pytest.raises(InvalidEffect):
                await ledger.execute(
                    target="payments", operation="refund.create", key="..", request={}, call=called.append
                )
            assert (await ledger.store.load("..")).effect is None

    run(body())
    assert called == []


# -- the lookup client believes only an answer about the effect it asked for ---------------------------

ASKED = "payments:k-1"


@pytest.mark.parametrize(
    "status,body",
    [
        (200, {"status": "OK"}),  # faust's index page
        (200, {"effect_id": "payments:other", "known": True, "events": []}),
        (200, {"known": True, "events": []}),
        (200, ["not", "an", "object"]),
        (404, {"known": False}),
        (404, {"effect_id": "payments:other", "known": False}),
        (404, {"error": "not found"}),
        (200, {"effect_id": ASKED, "known": True, "events": "not a list"}),
    ],
    ids=[
        "faust-index",
        "200-other-effect",
        "200-no-effect-id",
        "200-not-an-object",
        "404-no-effect-id",
        "404-other-effect",
        "404-not-ours",
        "200-events-not-a-list",
    ],  # fmt: skip
)
def test_lookup_answer_about_another_or_no_effect_is_an_error_never_unknown(status: int, body: Any) -> None:
    with LoopbackServer(lambda path: Reply(status, json.dumps(body).encode())) as srv:
        with pytest.raises(LedgerUnavailable):
            run(_events(ProcessorLookup(srv.url), ASKED))
        assert len(srv.seen) == 1


def test_lookup_answer_about_the_asked_effect_is_accepted() -> None:
    with LoopbackServer(lambda path: Reply(404, json.dumps({"effect_id": ASKED, "known": False}).encode())) as srv:
        assert run(_events(ProcessorLookup(srv.url), ASKED)) == []
    with LoopbackServer(
        lambda path: Reply(200, json.dumps({"effect_id": ASKED, "known": True, "events": ["AAE="]}).encode())
    ) as srv:
        assert run(_events(ProcessorLookup(srv.url), ASKED)) == [b"\x00\x01"]
