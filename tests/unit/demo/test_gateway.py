"""The fake payment gateway (``effect_ledger.demo.gateway``) behaves like a real destination, over real
HTTP on loopback: idempotency keys honoured only by the kinds that claim to, lookup by key only where
offered, and failures on demand (a rejection, an outage before committing, a lost reply)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from effect_ledger.demo.client import GatewayClient, GatewayUnavailable, RefundRejected
from effect_ledger.demo.gateway import KINDS, Gateway
from effect_ledger.errors import DefiniteFailure
from tests.sdk_contract import run

KEYED = ("key+lookup", "key")
LOOKUP = ("key+lookup", "lookup")


@pytest.fixture(scope="module")
def gateways() -> Iterator[dict[str, Gateway]]:
    """One running gateway per kind for the module (stopping one takes up to half a second)."""
    running = {kind: Gateway(kind).start() for kind in KINDS}
    yield running
    for gw in running.values():
        gw.stop()


def fresh(gateways: dict[str, Gateway], kind: str) -> Gateway:
    gw = gateways[kind]
    assert http("POST", f"{gw.url}/_admin/reset", {}) == (200, {"reset": True})
    return gw


@pytest.fixture(params=KINDS)
def gateway(request: pytest.FixtureRequest, gateways: dict[str, Gateway]) -> Gateway:
    return fresh(gateways, request.param)


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def fail(gw: Gateway, mode: str, count: int = 1, delay: float = 0.0) -> None:
    status, body = http("POST", f"{gw.url}/_admin/fail", {"mode": mode, "count": count, "delay": delay})
    assert status == 200 and body["queued"] >= count


def refunds(gw: Gateway) -> list[dict[str, Any]]:
    status, body = http("GET", f"{gw.url}/_admin/refunds")
    assert status == 200 and body["kind"] == gw.state.kind
    return body["refunds"]  # type: ignore[no-any-return]


async def refund(gw: Gateway, key: str | None, order: str = "123", amount: int = 4800) -> dict[str, Any]:
    async with GatewayClient(gw.url) as client:
        return await client.refund(order, amount, idempotency_key=key)


# --- idempotency keys -----------------------------------------------------------------------------------


def test_same_key_twice(gateway: Gateway) -> None:
    first = run(refund(gateway, "k-1"))
    second = run(refund(gateway, "k-1"))
    assert first["idempotency_key"] == "k-1" and first["status"] == "succeeded"
    assert (first["order"], first["amount"], first["currency"]) == ("123", 4800, "CNY")
    made = refunds(gateway)
    if gateway.state.kind in KEYED:
        assert second == first  # the original refund, not a second one
        assert [r["id"] for r in made] == [first["id"]]
    else:
        assert second["id"] != first["id"]  # paid twice: this destination does not deduplicate
        assert [r["id"] for r in made] == [first["id"], second["id"]]


def test_different_keys_and_no_key_make_new_refunds(gateway: Gateway) -> None:
    ids = [run(refund(gateway, k))["id"] for k in ("k-1", "k-2", None, None)]
    assert len(set(ids)) == 4 and len(refunds(gateway)) == 4


def test_refund_ids_are_sequential_and_reset_clears_the_books(gateway: Gateway) -> None:
    assert run(refund(gateway, "a"))["id"] == "re_0001"
    assert run(refund(gateway, "b"))["id"] == "re_0002"
    fail(gateway, "reject")
    assert http("POST", f"{gateway.url}/_admin/reset", {}) == (200, {"reset": True})
    assert refunds(gateway) == []
    assert run(refund(gateway, "a"))["id"] == "re_0001"  # the queued failure was dropped too


# --- lookup by key --------------------------------------------------------------------------------------


def test_lookup_by_key(gateway: Gateway) -> None:
    made = run(refund(gateway, "k-9"))
    status, body = http("GET", f"{gateway.url}/refunds/by-key/k-9")
    missing, _ = http("GET", f"{gateway.url}/refunds/by-key/never-used")
    if gateway.state.kind in LOOKUP:
        assert (status, body) == (200, made)
        assert missing == 404
    else:
        assert status == 501 and missing == 501
        assert "not supported" in body["error"]


def test_lookup_returns_the_first_refund_of_a_key_it_does_not_deduplicate(gateways: dict[str, Gateway]) -> None:
    gw = fresh(gateways, "lookup")
    first = run(refund(gw, "k"))
    run(refund(gw, "k"))
    assert len(refunds(gw)) == 2
    assert http("GET", f"{gw.url}/refunds/by-key/k") == (200, first)


# --- failures on demand ------------------------------------------------------------------------------------


def test_reject_is_400_and_no_refund(gateway: Gateway) -> None:
    fail(gateway, "reject")
    status, body = http("POST", f"{gateway.url}/refunds", {"order": "1", "amount": 5}, {"Idempotency-Key": "k"})
    assert status == 400 and body["error"] == "card_declined"
    assert refunds(gateway) == []
    fail(gateway, "reject")
    with pytest.raises(RefundRejected) as ei:
        run(refund(gateway, "k"))
    assert isinstance(ei.value, DefiniteFailure)
    assert refunds(gateway) == []
    # The failure is used up: the next request goes through, with the same key.
    assert run(refund(gateway, "k"))["id"] == "re_0001"
    assert len(refunds(gateway)) == 1


def test_invalid_request_is_rejected(gateways: dict[str, Gateway]) -> None:
    gw = fresh(gateways, "key+lookup")
    for body in ({"order": "1", "amount": 0}, {"order": "1", "amount": "5"}, {"amount": 5}):
        status, reply = http("POST", f"{gw.url}/refunds", body)
        assert status == 400 and reply["error"] == "invalid_request"
    with pytest.raises(RefundRejected):
        run(refund(gw, "k", amount=-1))
    assert refunds(gw) == []


def test_error_is_503_and_no_refund(gateway: Gateway) -> None:
    fail(gateway, "error", count=2)
    status, _ = http("POST", f"{gateway.url}/refunds", {"order": "1", "amount": 5}, {"Idempotency-Key": "k"})
    assert status == 503
    with pytest.raises(GatewayUnavailable) as ei:
        run(refund(gateway, "k"))
    assert not isinstance(ei.value, DefiniteFailure)
    assert refunds(gateway) == []
    if gateway.state.kind in LOOKUP:
        assert http("GET", f"{gateway.url}/refunds/by-key/k")[0] == 404


def test_lost_reply_commits_the_refund_but_answers_503(gateway: Gateway) -> None:
    fail(gateway, "lost")
    with pytest.raises(GatewayUnavailable):
        run(refund(gateway, "k-lost"))
    made = refunds(gateway)
    assert len(made) == 1 and made[0]["idempotency_key"] == "k-lost"
    if gateway.state.kind in LOOKUP:
        assert http("GET", f"{gateway.url}/refunds/by-key/k-lost") == (200, made[0])
    retry = run(refund(gateway, "k-lost"))
    if gateway.state.kind in KEYED:
        assert retry == made[0] and len(refunds(gateway)) == 1  # a retry with the key is safe
    else:
        assert retry["id"] != made[0]["id"] and len(refunds(gateway)) == 2  # a blind retry pays twice


def test_slow_reply_commits_before_it_answers(gateways: dict[str, Gateway]) -> None:
    gw = fresh(gateways, "key+lookup")
    fail(gw, "slow", delay=0.5)

    async def body() -> None:
        task = asyncio.create_task(refund(gw, "k-slow"))
        end = time.monotonic() + 5
        while not gw.refunds():
            assert time.monotonic() < end
            await asyncio.sleep(0.005)
        assert not task.done()  # committed, reply not sent yet
        assert (await task)["id"] == gw.refunds()[0].id

    run(body())


def test_late_request_takes_effect_after_a_caller_gave_up(gateways: dict[str, Gateway]) -> None:
    gw = fresh(gateways, "lookup")
    fail(gw, "late", delay=0.5)

    async def body() -> None:
        with pytest.raises(TimeoutError):  # the caller gives up...
            async with asyncio.timeout(0.1):
                await refund(gw, "k-late")
        assert gw.refunds() == [] and http("GET", f"{gw.url}/refunds/by-key/k-late")[0] == 404
        end = time.monotonic() + 5
        while not gw.refunds():  # ... and the refund is made all the same, later
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        status, found = http("GET", f"{gw.url}/refunds/by-key/k-late")
        assert status == 200 and found["id"] == gw.refunds()[0].id

    run(body())


def test_failures_are_queued_in_order(gateways: dict[str, Gateway]) -> None:
    gw = fresh(gateways, "none")
    fail(gw, "error")
    fail(gw, "reject")
    with pytest.raises(GatewayUnavailable):
        run(refund(gw, None))
    with pytest.raises(RefundRejected):
        run(refund(gw, None))
    assert run(refund(gw, None))["id"] == "re_0001"


def test_unknown_kind_and_paths(gateways: dict[str, Gateway]) -> None:
    with pytest.raises(ValueError, match="unknown gateway kind"):
        Gateway("sometimes")
    gw = fresh(gateways, "key")
    assert http("GET", f"{gw.url}/nope")[0] == 404
    assert http("POST", f"{gw.url}/nope", {})[0] == 404

    async def not_json() -> int:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{gw.url}/refunds", data=b"{oops") as r:
                return r.status

    assert run(not_json()) == 400
