"""The ``ticket`` target kind: a ticketing system with a Jira-shaped JSON API.

**Key placement.** Ticketing systems do not deduplicate requests, so the key is stored on the
ticket itself (``TicketSearch.place``): in a custom field (``key_field = "customfield_10050"``, a
single-line text field) or as a label (``key_field = "labels"``).

**Lookup.** The reconciler searches with JQL, ``GET {api}/rest/api/2/search?jql=...`` (a custom field:
``cf[10050] ~ "KEY"``; labels: ``labels = "KEY"``; within ``project`` when one is declared), through
every page (``startAt``, ``maxResults``, ``total``), and takes a ticket as a match only if the field
holds exactly the key (``~`` is a text search and may match more). A match is Found, with the
ticket's own key (``OPS-123``) as the receipt. The search index lags behind a created ticket
(``search_lag``): an empty search before it has passed is Unknown (``effect_ledger.targets.search``).
"""

from __future__ import annotations

import re
from typing import Any

from yarl import URL

from effect_ledger.targets.search import KeySearch, Page, Reading

DEFAULT_SEARCH_LAG = "10s"
PAGE_SIZE = 50  # Jira's default maxResults
_CUSTOM = re.compile(r"customfield_([0-9]{1,12})")
_PROJECT = re.compile(r"[A-Z][A-Z0-9_]{0,254}")


def receipt_id(created: Any) -> str:
    """The receipt of a created ticket: its key (``OPS-123``), which is what a search finds."""
    return str(created["key"])


def jql_string(value: str) -> str:
    """``value`` as a double-quoted JQL string (quotes and backslashes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class TicketSearch(KeySearch):
    """Finds a ticket by the effect key in a custom field or a label (see the module docstring)."""

    def __init__(self, api: str, *, key_field: str, project: str | None = None, **kw: Any) -> None:
        super().__init__(api, **kw)
        custom = _CUSTOM.fullmatch(key_field)
        if key_field != "labels" and custom is None:
            raise ValueError(f"key_field {key_field!r} must be 'labels' or a custom field such as 'customfield_10050'")
        if project is not None and not _PROJECT.fullmatch(project):
            raise ValueError(f"project {project!r} must be a project key such as 'OPS'")
        self.key_field = key_field
        self.project = project
        self._clause = "labels = {}" if custom is None else f"cf[{custom.group(1)}] ~ {{}}"
        self._path = f"{self.api.path.rstrip('/')}/rest/api/2/search"

    def place(self, key: str, fields: dict[str, Any]) -> dict[str, Any]:
        """The ``fields`` of a create-issue call carrying ``key`` (a copy): the custom field set to it,
        or the key added to the labels."""
        if self.key_field == "labels":
            labels = [str(x) for x in fields.get("labels", [])]
            return {**fields, "labels": [*labels, key] if key not in labels else labels}
        return {**fields, self.key_field: key}

    def jql(self, key: str) -> str:
        """The JQL search for ``key``."""
        clause = self._clause.format(jql_string(key))
        return f"project = {self.project} AND {clause}" if self.project else clause

    def first_url(self, key: str) -> URL:
        return self._page_url(key, 0)

    def _page_url(self, key: str, start: int) -> URL:
        query = {"jql": self.jql(key), "startAt": str(start), "maxResults": str(PAGE_SIZE), "fields": self.key_field}
        return self.api.with_path(self._path).with_query(query)

    def read_page(self, asked: URL, body: Any, key: str) -> Reading:
        # Jira echoes the page it answers (startAt); the search itself is ours by the path.
        mine = f"{self._path}?startAt={asked.query.get('startAt')}"

        def bad(why: str) -> Reading:
            return Reading(mine, mine, why)

        if not isinstance(body, dict):
            return bad("not a search answer")
        start, total, issues = body.get("startAt"), body.get("total"), body.get("issues")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, total)) or not isinstance(
            issues, list
        ):
            return bad("a search answer without startAt, total and issues")
        assert isinstance(start, int) and isinstance(total, int)
        answered = f"{self._path}?startAt={start}"
        matches = []
        for issue in issues:
            fields = issue.get("fields") if isinstance(issue, dict) else None
            tkey = issue.get("key") if isinstance(issue, dict) else None
            if not isinstance(tkey, str) or not tkey or not isinstance(fields, dict):
                return Reading(mine, answered, "an issue without a key and fields")
            value = fields.get(self.key_field)
            if value == key or (self.key_field == "labels" and isinstance(value, list) and key in value):
                matches.append((tkey, issue))
        following = start + len(issues)
        if following < total and not issues:
            return Reading(mine, answered, f"an empty page before the end of the results (total {total})")
        return Reading(
            mine, answered, None, Page(matches, self._page_url(key, following) if following < total else None)
        )


__all__ = ["DEFAULT_SEARCH_LAG", "PAGE_SIZE", "TicketSearch", "jql_string", "receipt_id"]
