"""A ticketing system on loopback with a Jira-shaped JSON API, for the tests of the ``ticket``
target kind.

* ``POST /rest/api/2/issue`` (JSON ``{"fields": {...}}``) creates an issue and answers 201 with
  ``id``, ``key`` (``OPS-1``) and ``self``. Like Jira it deduplicates nothing: the same request twice
  is two tickets.
* ``GET /rest/api/2/search?jql=...&startAt=N&maxResults=M`` answers ``startAt``, ``maxResults``,
  ``total`` and ``issues`` (each ``id``, ``key``, ``fields``). The JQL understood here is what the
  kind sends: ``[project = KEY AND] cf[N] ~ "TEXT"`` (a text search: it also matches fields that
  merely contain the text, as Jira's ``~`` does) or ``labels = "LABEL"``. An issue is searchable
  ``lag`` seconds after it was created (Jira indexes asynchronously).
* ``GET /_admin/issues``: every issue made. Clock, lag and faults: ``effect_ledger.demo.fake_api``.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from effect_ledger.demo.fake_api import Answer, FakeState, Running, faulty_search

MAX_RESULTS = 50
_JQL = re.compile(
    r"(?:project = (?P<project>[A-Z][A-Z0-9_]*) AND )?"
    r'(?:cf\[(?P<cf>[0-9]+)\] ~ |labels = )"(?P<value>(?:[^"\\]|\\.)*)"'
)
_UNESCAPE = re.compile(r"\\(.)")


class TicketApi:
    """The books and the routes of the fake (served by ``Running``)."""

    def __init__(self, lag_s: float = 0.0, project: str = "OPS") -> None:
        self.state = FakeState(lag_s)
        self.url = ""
        self.project = project
        self.issues: list[dict[str, Any]] = []
        self._created: dict[str, float] = {}
        self._ids = itertools.count(10001)

    def made(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [dict(i) for i in self.issues]

    def post(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        if path != "/rest/api/2/issue":
            return _error(404, f"no route for POST {path}")
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return _error(400, "the body is not JSON")
        fields = body.get("fields") if isinstance(body, dict) else None
        if not isinstance(fields, dict) or not fields.get("summary"):
            return _error(400, "fields.summary is required")
        fault = self.state.fault("create")
        if fault is not None and fault.mode == "error":
            return _error(503, "try again later")
        with self.state.lock:
            n = next(self._ids)
            issue: dict[str, Any] = {
                "id": str(n),
                "key": f"{self.project}-{n - 10000}",
                "self": f"{self.url}/rest/api/2/issue/{n}",
                "fields": fields,
            }
            self.issues.append(issue)
            self._created[issue["id"]] = self.state.now()
        if fault is not None and fault.mode == "lost":
            return _error(503, "connection reset")
        created = {k: issue[k] for k in ("id", "key", "self")}
        return Answer(201, created, {}, fault.delay if fault is not None and fault.mode == "slow" else 0.0)

    def get(self, path: str) -> Answer:
        split = urlsplit(path)
        if split.path == "/_admin/issues":
            return Answer(200, {"issues": self.made()}, {})
        if split.path == "/rest/api/2/search":
            return self._search(path, split.query)
        return _error(404, f"no route for GET {split.path}")

    def _search(self, path: str, query: str) -> Answer:
        q = parse_qs(query)
        m = _JQL.fullmatch((q.get("jql") or [""])[0])
        if m is None:
            return _error(400, "Error in the JQL Query: only the effect-ledger searches are understood here")
        value = _UNESCAPE.sub(r"\1", m.group("value"))
        start = int((q.get("startAt") or ["0"])[0] or 0)
        size = min(MAX_RESULTS, int((q.get("maxResults") or [str(MAX_RESULTS)])[0] or MAX_RESULTS))
        with self.state.lock:
            self.state.searches += 1
            horizon = self.state.now() - self.state.lag_s
            hits = [
                i
                for i in self.issues
                if self._created[i["id"]] <= horizon
                and (m.group("project") is None or i["key"].startswith(m.group("project") + "-"))
                and _matches(i["fields"], m.group("cf"), value)
            ]
        good = Answer(
            200, {"startAt": start, "maxResults": size, "total": len(hits), "issues": hits[start : start + size]}, {}
        )
        other = {"startAt": start + size, "maxResults": size, "total": len(hits), "issues": []}
        return faulty_search(self.state.fault("search"), self.url + path, good, other)


def _matches(fields: dict[str, Any], cf: str | None, value: str) -> bool:
    if cf is None:
        labels = fields.get("labels")
        return isinstance(labels, list) and value in labels
    text = fields.get(f"customfield_{cf}")
    return isinstance(text, str) and value in text  # "~" is a text search, not equality


def _error(status: int, message: str) -> Answer:
    return Answer(status, {"errorMessages": [message], "errors": {}}, {})


def ticket_api(lag_s: float = 0.0, port: int = 0, project: str = "OPS") -> Running:
    """A fake ticketing API, not yet started: ``with ticket_api(lag_s=1) as srv: srv.url``."""
    return Running(TicketApi(lag_s, project), port)
