"""The built-in target kinds in the targets file (``kind = "payment"`` / ``"ticket"``): their
defaults, where the key is placed, and their declaration mistakes (one line, FILE:LINE)."""

from __future__ import annotations

import pytest

from effect_ledger.errors import TargetsError
from effect_ledger.targets.load import parse_targets
from effect_ledger.targets.payment import PaymentSearch, search_string
from effect_ledger.targets.ticket import TicketSearch, jql_string

PAYMENT = '[targets.refunds]\nkind = "payment"\napi = "https://api.stripe.example"\n'
TICKET = '[targets.incidents]\nkind = "ticket"\napi = "https://jira.example"\nkey_field = "labels"\n'


def test_payment_defaults_and_key_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRIPE_KEY", "sk_test_1")
    (t,) = parse_targets(PAYMENT + 'headers = { Authorization = "Bearer ${STRIPE_KEY}" }\n')
    assert (t.honours_keys, t.retention_s, t.lands_within_s) == (True, 86400.0, 62.0)  # 2 s + the 60 s index lag
    assert isinstance(t.reconciler, PaymentSearch) and t.reconciler.name == "payment:refunds"
    headers, form = t.reconciler.place("refunds:k'1", {"amount": "4800"})
    assert headers == {"Idempotency-Key": "refunds:k'1"}
    assert form == {"amount": "4800", "metadata[effect_key]": "refunds:k'1"}
    url = t.reconciler.first_url("refunds:k'1")
    assert url.path == "/v1/payment_intents/search"
    assert url.query["query"] == "metadata['effect_key']:'refunds:k\\'1'"
    assert search_string("a\\b'c") == "'a\\\\b\\'c'"


def test_ticket_defaults_and_key_placement() -> None:
    (t,) = parse_targets(TICKET + 'project = "OPS"\nsearch_lag = "0s"\nkey_retention = "forever"\n')
    assert (t.honours_keys, t.retention_s, t.lands_within_s) == (False, None, 2.0)
    assert isinstance(t.reconciler, TicketSearch)
    assert t.reconciler.place("k1", {"summary": "s", "labels": ["x"]}) == {"summary": "s", "labels": ["x", "k1"]}
    assert t.reconciler.jql('a"b') == 'project = OPS AND labels = "a\\"b"'
    assert t.receipt_id is not None and t.receipt_id({"id": "10001", "key": "OPS-1"}) == "OPS-1"
    (cf,) = parse_targets(TICKET.replace('"labels"', '"customfield_10050"'))
    assert cf.reconciler.place("k1", {"summary": "s"}) == {"summary": "s", "customfield_10050": "k1"}  # type: ignore[union-attr]
    assert cf.reconciler.jql("k1") == 'cf[10050] ~ "k1"'  # type: ignore[union-attr]
    assert jql_string("\\") == '"\\\\"'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[targets.x]\nkind = "fax"\n', ":2: target 'x': kind must be one of http, payment, smtp, sql, ticket"),
        (PAYMENT + 'lookup = "https://a/{key}"\n', ":4: target 'refunds': 'lookup' does not go with kind"),
        (PAYMENT + 'key_field = "labels"\n', ":4: target 'refunds': 'key_field' is a setting of kind 'ticket'"),
        (PAYMENT + "found_status = [200]\n", ":4: target 'refunds': 'found_status' applies to an HTTP lookup"),
        ('[targets.refunds]\nkind = "payment"\n', 'kind = "payment" needs api'),
        ('[targets.t]\nkind = "ticket"\napi = "https://j.example"\n', "needs key_field"),
        (TICKET.replace('"labels"', '"summary"'), "key_field 'summary' must be 'labels' or a custom field"),
        (PAYMENT + 'search_lag = "soon"\n', ":4: target 'refunds': search_lag"),
        (PAYMENT + 'object = "Payment Intents"\n', "object 'Payment Intents' must be a resource name"),
        (PAYMENT + "max_pages = 0\n", "max_pages must be a whole number from 1 to 100"),
        (PAYMENT.replace("https://api.stripe.example", "https://api.stripe.example/?x=1"), "without a query"),
    ],
)
def test_declaration_mistakes(text: str, message: str) -> None:
    with pytest.raises(TargetsError) as e:
        parse_targets(text, "targets.toml")
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
