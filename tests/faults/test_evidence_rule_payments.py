"""Issue 34: only the destination's own answer is evidence, pinned for the ``payment`` (Stripe-shaped)
and ``ticket`` (Jira-shaped) kinds. Against the real loopback fakes, with the object present at the
destination and without it, every answer that is not the named search's own, readable page — an
error status, a redirect (same origin or another), a slow or oversized answer, another shape, another
page or search, an HTML login page — is Unknown: never Absent (which would let the ledger pay again)
and never a receipt. A redirect is never followed, so the API key never reaches another origin."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from effect_ledger.core.model import Verdict
from effect_ledger.core.reconcile import Absent, EffectView, Found, Unknown, judge
from effect_ledger.demo.fake_api import Running
from effect_ledger.demo.payment_api import payment_api
from effect_ledger.demo.ticket_api import ticket_api
from effect_ledger.targets.load import parse_targets
from tests.faults.http_servers import LoopbackServer, Reply

SECRET = "sk_live_not_for_other_hosts"
KEY = {"payment": "payments:4f2a", "ticket": "tickets:9c1e"}


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[LoopbackServer]:
    """Another origin that would answer every search with an empty, well-formed result (one for the
    module: nothing may ever reach it)."""
    empty = json.dumps({"object": "search_result", "url": "/v1/payment_intents/search", "has_more": False,
                        "next_page": None, "data": [], "startAt": 0, "total": 0, "issues": []}).encode()  # fmt: skip
    with LoopbackServer(lambda path: Reply(200, empty, {"Content-Type": "application/json"})) as srv:
        yield srv


def _declare(kind: str, url: str, **extra: str) -> Any:
    extra = {"search_lag": '"0s"', **extra}
    lines = [
        f'kind = "{kind}"',
        f'api = "{url}"',
        f'headers = {{ Authorization = "Bearer {SECRET}" }}',
    ]
    if kind == "ticket":
        lines.append('key_field = "customfield_10050"')
    lines += [f"{k} = {v}" for k, v in extra.items()]
    (target,) = parse_targets(f"[targets.{kind}s]\n" + "\n".join(lines) + "\n")
    return target


def _post(url: str, path: str, data: bytes, headers: dict[str, str]) -> Any:
    req = urllib.request.Request(url + path, data, headers, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _make(kind: str, srv: Running, target: Any, key: str) -> str:
    """Create the object at the destination the way the kind places the key; its own id."""
    if kind == "payment":
        headers, form = target.reconciler.place(key, {"amount": "4800", "currency": "cny"})
        body = urllib.parse.urlencode(form).encode()
        return str(_post(srv.url, "/v1/payment_intents", body, headers)["id"])
    fields = target.reconciler.place(key, {"summary": "refund failed"})
    body = json.dumps({"fields": fields}).encode()
    return str(_post(srv.url, "/rest/api/2/issue", body, {"Content-Type": "application/json"})["key"])


def _fail(srv: Running, mode: str, **extra: Any) -> None:
    body = json.dumps({"on": "search", "mode": mode, **extra}).encode()
    _post(srv.url, "/_admin/fail", body, {"Content-Type": "application/json"})


def _view(key: str) -> EffectView:
    now = int(time.time() * 1000)
    return EffectView(key, key.split(":")[0], "create", None, 1, now - 600_000, now - 300_000)


def _fake(kind: str) -> Running:
    return payment_api() if kind == "payment" else ticket_api()


@pytest.mark.parametrize("kind", ("payment", "ticket"))
@pytest.mark.parametrize("present", (True, False), ids=("present", "absent"))
@pytest.mark.parametrize(
    "mode", ("error", "redirect", "redirect-elsewhere", "shape", "wrong-page", "html", "huge", "slow")
)
def test_only_the_searchs_own_answer_counts(kind: str, present: bool, mode: str, elsewhere: LoopbackServer) -> None:
    with _fake(kind) as srv:
        extra = {"timeout": '"1s"'} if mode == "slow" else {"max_body": "65536"} if mode == "huge" else {}
        target = _declare(kind, srv.url, **extra)
        key = KEY[kind]
        if present:
            _make(kind, srv, target, key)
        # The control: without a fault, the same search answers for itself.
        control = asyncio.run(target.reconciler.check(_view(key)))
        assert isinstance(control, Found if present else Absent), control
        if mode == "redirect-elsewhere":
            _fail(srv, "redirect", to=f"{elsewhere.url}/v1/payment_intents/search")
        else:
            _fail(srv, mode, delay=3 if mode == "slow" else 1)
        answer = asyncio.run(target.reconciler.check(_view(key)))
        assert isinstance(answer, Unknown), f"{kind}/{mode}: {answer}"
        # And what the ledger makes of it: asked again, then escalated; never ABSENT, never FOUND.
        verdict = judge(_view(key), target, answer, target.reconciler.name, int(time.time() * 1000)).verdict
        assert verdict in (Verdict.UNKNOWN, Verdict.ESCALATE)
    assert elsewhere.seen == []  # a redirect is never followed: the API key stayed home


@pytest.mark.parametrize("kind", ("payment", "ticket"))
def test_an_empty_search_before_the_index_caught_up_is_not_absent(kind: str) -> None:
    """The object exists but the index has not caught up (the fake's lag): the search comes back
    empty. Until the declared search_lag has passed since the call could last land, the ledger
    holds ("absent so far"), and only after it may the effect be ABSENT."""
    with _fake(kind) as srv:
        srv.app.state.lag_s = 3600.0  # the fake indexes after an hour
        target = _declare(kind, srv.url, search_lag='"30m"')
        assert target.lands_within_s == 2 + 1800  # the lag is part of when a call may still land
        key = KEY[kind]
        _make(kind, srv, target, key)
        view = _view(key)  # its deadline was 5 minutes ago
        answer = asyncio.run(target.reconciler.check(view))
        assert isinstance(answer, Absent)  # the search is empty ...
        now = int(time.time() * 1000)
        early = judge(view, target, answer, target.reconciler.name, now)
        assert early.verdict == Verdict.UNKNOWN and "may still land" in early.reason  # ... and proves nothing yet
        later = judge(view, target, answer, target.reconciler.name, view.deadline_ms + 1_802_001)
        assert later.verdict == Verdict.ABSENT


def test_past_the_24h_key_retention_absent_escalates_and_the_key_is_forgotten() -> None:
    """Stripe forgets an idempotency key after 24 h: the fake replays within it (Idempotent-Replayed)
    and pays again after it. So past the retention no answer may let the ledger rely on the key:
    "absent" escalates to a person."""
    with payment_api() as srv:
        target = _declare("payment", srv.url)
        assert (target.honours_keys, target.retention_s) == (True, 86400.0)
        headers, form = target.reconciler.place(KEY["payment"], {"amount": "4800", "currency": "cny"})
        body = urllib.parse.urlencode(form).encode()
        first = _post(srv.url, "/v1/payment_intents", body, headers)
        req = urllib.request.Request(srv.url + "/v1/payment_intents", body, headers, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.headers["Idempotent-Replayed"] == "true" and json.loads(r.read())["id"] == first["id"]
        _post(srv.url, "/_admin/advance", json.dumps({"seconds": 25 * 3600}).encode(), {})
        again = _post(srv.url, "/v1/payment_intents", body, headers)
        assert again["id"] != first["id"] and len(srv.app.made()) == 2  # forgotten: a second payment
        view = EffectView(KEY["payment"], "payments", "create", None, 1, 0, 1000)
        late = judge(view, target, Absent("no payment"), "payment:payments", 25 * 3600 * 1000)
        assert late.verdict == Verdict.ESCALATE and "retention" in late.reason


def test_a_fuzzy_match_on_another_page_is_not_ours_and_ours_is_found_on_the_next() -> None:
    """Jira's ``~`` is a text search: keys that merely contain ours fill the first page (50); the
    ticket that holds exactly our key is on the second, and only it is the receipt."""
    with ticket_api() as srv:
        target = _declare("ticket", srv.url)
        key = KEY["ticket"]
        for i in range(55):
            _make("ticket", srv, target, f"{key}-{i}")
        own = _make("ticket", srv, target, key)
        answer = asyncio.run(target.reconciler.check(_view(key)))
        assert isinstance(answer, Found) and answer.receipt_id == own, answer
        assert srv.app.state.searches == 2
        lone = asyncio.run(target.reconciler.check(_view(key + "-x")))
        assert isinstance(lone, Absent)


def test_more_pages_than_max_pages_is_unknown() -> None:
    with ticket_api() as srv:
        target = _declare("ticket", srv.url, max_pages="1")
        key = KEY["ticket"]
        for i in range(51):
            _make("ticket", srv, target, f"{key}-{i}")
        answer = asyncio.run(target.reconciler.check(_view(key)))
        assert isinstance(answer, Unknown) and "max_pages" in answer.reason


def test_a_search_lag_declared_too_short_is_caught_by_the_providers_replay(tmp_path: Any) -> None:
    """Why a payment target keeps honours_keys and the 24 h retention although it is searched: the
    index lags an hour but the target declares no lag, so an empty search is taken for ABSENT and the
    call runs again, with the same key, within the retention. The provider answers from its key
    store (Idempotent-Replayed: true): still one payment, recorded as the original under its own id,
    marked as a replay."""
    from effect_ledger.errors import EffectUncertain
    from effect_ledger.sdk.ledger import Ledger
    from effect_ledger.targets.payment import recorded
    from tests.sdk_contract import FakeClock

    async def scenario(srv: Running, target: Any) -> Any:
        clock = FakeClock(int(time.time() * 1000))
        async with await Ledger.open(str(tmp_path / "effects.db"), targets=[target], clock=clock) as ledger:
            import aiohttp

            async with aiohttp.ClientSession() as http:

                async def pay(key: str) -> Any:
                    headers, form = target.reconciler.place(key, {"amount": "4800", "currency": "cny"})
                    async with http.post(f"{srv.url}/v1/payment_intents", data=form, headers=headers) as r:
                        body = await r.json()
                        if r.status != 200:
                            raise ConnectionError(f"HTTP {r.status}")  # lost after the commit: unknown
                        return recorded(body, r.headers)

                spec = {"target": "payments", "operation": "pay", "run_id": "r1", "step": "s1",
                        "request": {"order": "123"}, "call": pay, "timeout": 5.0}  # fmt: skip
                with pytest.raises(EffectUncertain):
                    await ledger.execute(**spec)
                clock.advance(60_000)  # past the deadline and lands_within: an empty search now "proves" absence
                return await ledger.execute(**spec)

    with payment_api() as srv:
        srv.app.state.lag_s = 3600.0
        target = _declare("payment", srv.url, lands_within='"10ms"')
        # The first create commits, and its answer is lost.
        _post(srv.url, "/_admin/fail", json.dumps({"on": "create", "mode": "lost"}).encode(), {})
        confirmation = asyncio.run(scenario(srv, target))
        assert len(srv.app.made()) == 1 and srv.app.replays == 1
        assert confirmation.receipt_id == srv.app.made()[0]["id"]
        assert confirmation.called and confirmation.value["idempotent_replayed"] is True
