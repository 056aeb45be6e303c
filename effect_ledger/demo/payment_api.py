"""A payment API on loopback shaped like Stripe's, following its documented behaviour, for the tests
of the ``payment`` target kind (the real one cannot be reached from here).

* ``POST /v1/payment_intents`` (form-encoded: ``amount``, ``currency``, ``metadata[NAME]``) creates a
  payment intent ``pi_...``. With an ``Idempotency-Key`` header, a retry with the same key and the
  same parameters within 24 hours returns the original object with ``Idempotent-Replayed: true``;
  the same key with other parameters is a 400 ``idempotency_error``; after 24 hours the key is
  forgotten and the same request creates a second payment (as at Stripe).
* ``GET /v1/payment_intents/{id}`` retrieves one.
* ``GET /v1/payment_intents/search?query=metadata['NAME']:'VALUE'&limit=N&page=TOKEN`` searches by
  metadata: a ``search_result`` with ``data``, ``has_more``, ``next_page`` and ``url``. An object
  is searchable only ``lag`` seconds after it was created (Stripe: "typically within a minute").
* ``GET /_admin/payments``: every payment made. Clock, lag and faults: ``effect_ledger.demo.fake_api``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

from effect_ledger.demo.fake_api import Answer, FakeState, Running, faulty_search

KEY_RETENTION_S = 24 * 3600.0  # Stripe: "keys are eligible to be removed ... after at least 24 hours"
MAX_LIMIT = 100
_QUERY = re.compile(r"metadata\['((?:[^'\\]|\\.)*)'\]:'((?:[^'\\]|\\.)*)'")
_UNESCAPE = re.compile(r"\\(.)")


class PaymentApi:
    """The books and the routes of the fake (served by ``Running``)."""

    def __init__(self, lag_s: float = 0.0) -> None:
        self.state = FakeState(lag_s)
        self.url = ""
        self.payments: list[dict[str, Any]] = []
        self._created: dict[str, float] = {}
        self._keys: dict[str, tuple[str, float, dict[str, Any]]] = {}  # key -> (params digest, at, object)
        self._ids = itertools.count(1)
        self.replays = 0

    def made(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [dict(p) for p in self.payments]

    def post(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        if path != "/v1/payment_intents":
            return _error(404, "invalid_request_error", f"Unrecognized request URL (POST: {path})")
        params = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
        fault = self.state.fault("create")
        if fault is not None and fault.mode == "error":
            return _error(503, "api_error", "try again later")
        key = headers.get("idempotency-key")
        digest = hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()
        with self.state.lock:
            now = self.state.now()
            if key is not None:
                seen = self._keys.get(key)
                if seen is not None and now - seen[1] < KEY_RETENTION_S:
                    if seen[0] != digest:
                        return _error(
                            400,
                            "idempotency_error",
                            "Keys for idempotent requests can only be used with the same parameters they were "
                            "first used with.",
                        )
                    self.replays += 1
                    return Answer(200, seen[2], {"Idempotent-Replayed": "true", "Idempotency-Key": key})
            amount = params.get("amount", "")
            if not amount.isdigit() or int(amount) <= 0 or not params.get("currency"):
                return _error(400, "invalid_request_error", "amount (a positive integer) and currency are required")
            metadata = {m[9:-1]: v for m, v in params.items() if m.startswith("metadata[") and m.endswith("]")}
            obj: dict[str, Any] = {
                "id": f"pi_{next(self._ids):06d}",
                "object": "payment_intent",
                "amount": int(amount),
                "currency": params["currency"].lower(),
                "metadata": metadata,
                "status": "succeeded",
                "created": int(now),
            }
            self.payments.append(obj)
            self._created[obj["id"]] = now
            if key is not None:
                self._keys[key] = (digest, now, obj)  # a forgotten key is simply overwritten
        if fault is not None and fault.mode == "lost":
            return _error(503, "api_error", "connection reset")
        headers_out = {"Idempotency-Key": key} if key else {}
        return Answer(200, obj, headers_out, fault.delay if fault is not None and fault.mode == "slow" else 0.0)

    def get(self, path: str) -> Answer:
        split = urlsplit(path)
        if split.path == "/_admin/payments":
            return Answer(200, {"payments": self.made(), "replays": self.replays}, {})
        if split.path == "/v1/payment_intents/search":
            return self._search(path, split.query)
        if split.path.startswith("/v1/payment_intents/"):
            pid = split.path.rsplit("/", 1)[1]
            with self.state.lock:
                found = next((p for p in self.payments if p["id"] == pid), None)
            if found is None:
                return _error(404, "invalid_request_error", f"No such payment_intent: '{pid}'")
            return Answer(200, found, {})
        return _error(404, "invalid_request_error", f"Unrecognized request URL (GET: {split.path})")

    def _search(self, path: str, query: str) -> Answer:
        q = parse_qs(query)
        m = _QUERY.fullmatch((q.get("query") or [""])[0])
        if m is None:
            return _error(400, "invalid_request_error", "search query: only metadata['KEY']:'VALUE' is supported here")
        name, value = (_UNESCAPE.sub(r"\1", g) for g in m.groups())
        limit = min(MAX_LIMIT, int((q.get("limit") or ["10"])[0] or 10))
        page = (q.get("page") or [""])[0]
        start = int(page[5:]) if page.startswith("page_") and page[5:].isdigit() else 0
        with self.state.lock:
            self.state.searches += 1
            horizon = self.state.now() - self.state.lag_s
            hits = [p for p in self.payments if self._created[p["id"]] <= horizon and p["metadata"].get(name) == value]
        chunk = hits[start : start + limit]
        more = start + limit < len(hits)
        good = Answer(
            200,
            {
                "object": "search_result",
                "url": "/v1/payment_intents/search",
                "has_more": more,
                "next_page": f"page_{start + limit}" if more else None,
                "data": chunk,
            },
            {},
        )
        other = {
            "object": "search_result",
            "url": "/v1/charges/search",
            "has_more": False,
            "next_page": None,
            "data": [],
        }
        return faulty_search(self.state.fault("search"), self.url + path, good, other)


def _error(status: int, kind: str, message: str) -> Answer:
    return Answer(status, {"error": {"type": kind, "message": message}}, {})


def payment_api(lag_s: float = 0.0, port: int = 0) -> Running:
    """A fake payment API, not yet started: ``with payment_api(lag_s=1) as srv: srv.url``."""
    return Running(PaymentApi(lag_s), port)
