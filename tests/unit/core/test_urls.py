"""``safe_url`` and ``scrub``: the one rule for showing a URL (effect_ledger.core.urls). Then the
reconcilers that put a URL in an Unknown's reason, asked for real over loopback (a closed port, a
server answering an error), with a password and a query token in the URL built by the Python API
(the targets file refuses the password; the Python API's URL still must not leak it)."""

from __future__ import annotations

import asyncio

import pytest

from effect_ledger.core.reconcile import EffectView, Unknown
from effect_ledger.core.urls import credentials_in, safe_url, scrub
from effect_ledger.targets.http import HttpReconciler
from effect_ledger.targets.payment import PaymentSearch
from effect_ledger.targets.ticket import TicketSearch
from tests.faults.http_servers import LoopbackServer, Reply
from tests.faults.test_evidence_rule import closed_port


@pytest.mark.parametrize(
    "url,shown",
    [
        ("http://u:APISECRET@127.0.0.1:9/v1/x", "http://u:***@127.0.0.1:9/v1/x"),
        ("http://TOKENSECRET@api.example/x", "http://***@api.example/x"),
        ("https://h/r/k?token=QTOKSECRET&page=2", "https://h/r/k?token=***&page=***"),
        ("https://h/r/k?flag&x=", "https://h/r/k?flag&x="),
        ("https://h/r/k#FRAGSECRET", "https://h/r/k#***"),
        ("postgresql://app:PGSECRET@db:5432/ledger?sslmode=require", "postgresql://app:***@db:5432/ledger?sslmode=***"),
        ("https://h/r/k", "https://h/r/k"),
        ("sqlite:////var/lib/a.db", "sqlite:////var/lib/a.db"),
        ("INBOX", "INBOX"),
        ("http://[::1:9/x?t=SECRET", "(an unparsable URL)"),
        ("http://u:PORTSECRET@h:notaport/x", "(an unparsable URL)"),
    ],
)
def test_safe_url(url: str, shown: str) -> None:
    assert safe_url(url) == shown
    assert "SECRET" not in safe_url(url)


def test_credentials_in() -> None:
    assert credentials_in("http://u:p@h/") and credentials_in("http://t@h/") and credentials_in("smtp://u:p@h:notaport")
    assert not credentials_in("http://h/path") and not credentials_in("http://h/x?mail=a@b")


def test_scrub_removes_the_url_and_its_pieces() -> None:
    url = "http://u:APISECRET@h/x?token=QTOKSECRET&page=1"
    text = f"Cannot connect to {url} (auth APISECRET, token QTOKSECRET, page 1)"
    assert scrub(text, url) == ("Cannot connect to http://u:***@h/x?token=***&page=*** (auth ***, token ***, page 1)")
    assert scrub("nothing to hide", "https://h/x") == "nothing to hide"


def view(key: str = "k-1") -> EffectView:
    return EffectView(key, "t", "op", {}, 1, 0, 1)


def reason_of(answer: object) -> str:
    assert isinstance(answer, Unknown), answer
    return answer.reason


def test_http_reconciler_reasons_hide_password_and_query_values() -> None:
    port = closed_port()
    r = HttpReconciler(f"http://u:APISECRET@127.0.0.1:{port}/r/{{key}}?token=QTOKSECRET", timeout=5)
    reason = reason_of(asyncio.run(r.check(view())))
    assert reason.startswith(f"GET http://u:***@127.0.0.1:{port}/r/k-1?token=***: "), reason
    assert "SECRET" not in reason


def test_http_reconciler_error_page_and_redirect_reasons_hide_secrets() -> None:
    # An error page that quotes the request, as many servers' do.
    with LoopbackServer(lambda path: Reply(500, f"no route for {path}".encode())) as srv:
        r = HttpReconciler(srv.url + "/r/{key}?token=QTOKSECRET", timeout=5)
        reason = reason_of(asyncio.run(r.check(view())))
        assert reason.startswith("HTTP 500: no route for /r/k-1?token=***"), reason
    with LoopbackServer(
        lambda path: Reply(302, b"", {"Location": "https://u:LOCSECRET@elsewhere/x?sig=SIGSECRET"})
    ) as srv:
        r = HttpReconciler(srv.url + "/r/{key}?token=QTOKSECRET", timeout=5)
        reason = reason_of(asyncio.run(r.check(view())))
        assert "redirect to https://u:***@elsewhere/x?sig=***" in reason and "SECRET" not in reason, reason


@pytest.mark.parametrize("kind", ["payment", "ticket"])
def test_search_reasons_hide_the_api_password(kind: str) -> None:
    port = closed_port()
    api = f"http://u:APISECRET@127.0.0.1:{port}"
    kw = dict(name=kind, search_lag_s=0, lands_within_s=0, timeout=5)
    search = PaymentSearch(api, **kw) if kind == "payment" else TicketSearch(api, key_field="labels", **kw)
    reason = reason_of(asyncio.run(search.check(view())))
    assert reason.startswith(f"GET http://u:***@127.0.0.1:{port}/"), reason
    assert "APISECRET" not in reason


def test_search_refusal_does_not_echo_the_api() -> None:
    with pytest.raises(ValueError) as e:
        PaymentSearch("http://u:APISECRET@h/v1?token=QTOKSECRET", name="p", search_lag_s=0, lands_within_s=0)
    assert "SECRET" not in str(e.value) and "token=***" in str(e.value)
