"""Built-in target kinds declared with ``kind = "..."`` in the targets file: each knows where the key
travels with the call and how to ask the destination for it, so a target is a few lines::

    [targets.refunds]
    kind = "payment"                      # a Stripe-shaped payment API (targets/payment.py)
    api = "https://api.stripe.com"
    headers = { Authorization = "Bearer ${STRIPE_SECRET_KEY}" }

    [targets.incidents]
    kind = "ticket"                       # a Jira-shaped ticketing API (targets/ticket.py)
    api = "https://jira.example"
    key_field = "customfield_10050"       # or "labels"
    project = "OPS"

A kind's settings (``KIND_SETTINGS``) sit beside the common ones (``honours_keys``, ``key_retention``,
``lands_within``, ``backoff``, ``definite_errors``, ...); a kind sets their defaults (a payment API
honours keys for 24 h) and a declaration may still override them. ``lookup`` and ``reconciler`` do
not go with a kind: the kind is how the destination is asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from effect_ledger.core.timeparse import TimeSpecError, duration_ms
from effect_ledger.core.urls import credentials_in, safe_url
from effect_ledger.errors import TargetsError
from effect_ledger.targets import payment, ticket
from effect_ledger.targets.search import KeySearch

# Settings of every kind, and of one kind only.
_SHARED = {"kind", "api", "search_lag", "max_pages", "headers", "timeout", "max_body"}
_OWN = {"payment": {"object", "metadata_key"}, "ticket": {"key_field", "project"}}
KINDS = tuple(_OWN)
KIND_SETTINGS = frozenset(_SHARED | {s for own in _OWN.values() for s in own})

# The defaults a kind gives the common settings: how the destination treats keys.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "payment": {"honours_keys": True, "key_retention": "24h"},
    "ticket": {"honours_keys": False},
}
_LAG = {"payment": payment.DEFAULT_SEARCH_LAG, "ticket": ticket.DEFAULT_SEARCH_LAG}

Fail = Callable[..., TargetsError]


def settings(body: Mapping[str, Any]) -> frozenset[str]:
    """The settings the declared ``kind`` allows (none without a kind)."""
    kind = body.get("kind")
    if kind not in _OWN:
        return frozenset({"kind"}) if "kind" in body else frozenset()
    return frozenset(_SHARED | _OWN[kind])


def with_defaults(body: Mapping[str, Any], fail: Fail) -> dict[str, Any]:
    """``body`` with the kind's defaults for the common settings it does not set; a wrong kind, or
    a setting of another kind, is a ``TargetsError``."""
    kind = body.get("kind")
    if kind not in _OWN:
        raise fail(f"kind must be one of {', '.join(repr(k) for k in KINDS)}, not {kind!r}", "kind")
    for other, own in _OWN.items():
        wrong = sorted((own - _OWN[kind]) & set(body))
        if other != kind and wrong:
            raise fail(f"{wrong[0]!r} is a setting of kind {other!r}, not {kind!r}", wrong[0])
    for field in ("lookup", "reconciler"):
        if field in body:
            raise fail(f'{field!r} does not go with kind = "{kind}": the kind says how to ask', field)
    return {**_DEFAULTS[kind], **body}


def refuse_credentials(body: Mapping[str, Any], field: str, fail: Fail) -> None:
    """A URL setting with ``user:password@`` is refused, and the message does not repeat it: the
    lookup's URLs go into the reasons written to the ledger, and a load error is printed. Credentials
    belong in ``headers``, filled from the environment with ``${VAR}``."""
    url = body.get(field)
    if isinstance(url, str) and credentials_in(url):
        raise fail(
            f"{field} must not hold a user name or password (user:password@, in {safe_url(url)!r}); "
            'send them as a header instead, from the environment: headers = { Authorization = "Bearer ${TOKEN}" }',
            field,
        )


def reconciler(
    name: str, body: Mapping[str, Any], fail: Fail, *, headers: Mapping[str, str], lands_within_s: float
) -> KeySearch:
    """The kind's reconciler for a target declared with ``body`` (checked by ``with_defaults``)."""
    kind = body["kind"]
    api = body.get("api")
    refuse_credentials(body, "api", fail)
    if not isinstance(api, str) or not api.startswith(("http://", "https://")):
        raise fail(f'kind = "{kind}" needs api = "https://..." (the API\'s base URL)', "api")
    kw: dict[str, Any] = {
        "name": f"{kind}:{name}",
        "headers": headers,
        "lands_within_s": lands_within_s,
        "hold_early": False,  # the target's lands_within includes search_lag (load.py): judge holds it
        "search_lag_s": _seconds(body.get("search_lag", _LAG[kind]), "search_lag", fail, zero=True),
    }
    if "timeout" in body:
        kw["timeout"] = _seconds(body["timeout"], "timeout", fail)
    for field in ("max_body", "max_pages"):
        if field in body:
            kw[field] = body[field]
    try:
        if kind == "payment":
            for field in ("object", "metadata_key"):
                if field in body:
                    kw[field] = _text(body, field, fail)
            return payment.PaymentSearch(api, **kw)
        if "key_field" not in body:
            raise fail('kind = "ticket" needs key_field = "customfield_NNNNN" or "labels"', None)
        project = _text(body, "project", fail) if "project" in body else None
        return ticket.TicketSearch(api, key_field=_text(body, "key_field", fail), project=project, **kw)
    except ValueError as e:
        # The message starts with the setting it is about ("max_pages must ...", "api '...' must ...").
        about = next((f for f in sorted(KIND_SETTINGS) if str(e).startswith(f)), None)
        raise fail(str(e), about) from None


def search_lag_s(reconciler: object) -> float:
    """How long the kind's search index may lag behind the destination (0 for other reconcilers): it
    is added to the target's ``lands_within``, since until then an empty search proves nothing."""
    return reconciler.search_lag_s if isinstance(reconciler, KeySearch) else 0.0


def receipt_id(kind: str) -> Callable[[Any], str] | None:
    """The receipt id of what the kind's create call returns, when it is not the value's ``"id"``:
    a ticket is known by its key (``OPS-123``), as its search finds it."""
    return ticket.receipt_id if kind == "ticket" else None


def _text(body: Mapping[str, Any], field: str, fail: Fail) -> str:
    value = body[field]
    if not isinstance(value, str) or not value:
        raise fail(f"{field} must be a non-empty string", field)
    return value


def _seconds(value: Any, field: str, fail: Fail, *, zero: bool = False) -> float:
    if not isinstance(value, str):
        raise fail(f'{field} must be a duration such as "0s", "60s", "5m"', field)
    try:
        ms = duration_ms(value)
    except TimeSpecError as e:
        raise fail(f"{field}: {e}", field) from None
    if ms < 0 or (ms == 0 and not zero):
        raise fail(f"{field} must be longer than zero", field)
    return ms / 1000


__all__ = ["KINDS", "KIND_SETTINGS", "receipt_id", "reconciler", "search_lag_s", "settings", "with_defaults"]
