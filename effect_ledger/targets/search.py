"""Asking a destination by searching for the key: the machinery the ``payment`` and ``ticket``
kinds share (``effect_ledger.targets.payment``, ``effect_ledger.targets.ticket``).

A search-based lookup differs from a by-key URL in three ways that each make "not found" weaker
evidence than it looks, so each is handled here once:

* **The index lags.** A search answers from an index that the destination fills some time after the
  object was created (Stripe: "typically within a minute"). An empty answer proves absence only once
  the latest moment the call could have taken effect (the attempt's deadline plus ``lands_within``)
  lies at least ``search_lag`` in the past; before that it is Unknown, asked again later. A kind
  declared in the targets file also adds ``search_lag`` to the target's ``lands_within``, so that
  ``judge`` itself holds an early "absent" (without using up a try) and no person can declare the
  effect ABSENT before the index has caught up.
* **Pages.** Results come in pages; a key is looked for on every page, up to ``max_pages``. A search
  with more pages than that is Unknown, never Absent.
* **Only the destination's own answer counts** (``effect_ledger.targets.evidence.admit``, the rule
  every lookup goes through). A redirect is never followed (Unknown, whatever its target), a body
  over ``max_body`` or not JSON is Unknown, and an answer in a shape the kind does not expect, or for
  a page or search the lookup did not ask for, is Unknown: never Absent and never a receipt.
  A match must carry the exact key in the field the kind placed it in (a search engine's fuzzy match
  is not a match).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from yarl import URL

from effect_ledger.core.reconcile import Absent, Answer, EffectView, Found, Unknown
from effect_ledger.core.urls import safe_url, scrub
from effect_ledger.targets.ask import DEFAULT_ASK_TIMEOUT_S
from effect_ledger.targets.evidence import Provenance, admit, origin
from effect_ledger.targets.http import DEFAULT_MAX_BODY, MAX_BODY_LIMIT, _read_bounded

if TYPE_CHECKING:
    import aiohttp

DEFAULT_MAX_PAGES = 10  # pages read for one lookup; more is Unknown (a search that broad is not an answer)
MAX_PAGES_LIMIT = 100


@dataclass(frozen=True)
class Page:
    """What one page of search results says: the objects carrying the key exactly (``(id, object)``),
    and the next page to ask for (None: this was the last)."""

    matches: list[tuple[str, Any]]
    next_url: URL | None


@dataclass(frozen=True)
class Reading:
    """One answer as the kind reads it: which page of which search it says it is (``answered``,
    compared with ``asked``, the page the lookup named), why it is not in the kind's shape (None: it
    is), and its page (None when it could not be read)."""

    asked: str
    answered: str
    shape_error: str | None = None
    page: Page | None = None


class KeySearch(ABC):
    """A reconciler that finds an effect by searching the destination for its key (see the module
    docstring for what an answer must be to count). Subclasses say where the key is placed, how the
    search is asked and how a page is read."""

    def __init__(
        self,
        api: str,
        *,
        name: str,
        search_lag_s: float,
        lands_within_s: float,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT_S,
        max_body: int = DEFAULT_MAX_BODY,
        max_pages: int = DEFAULT_MAX_PAGES,
        clock: Callable[[], int] | None = None,
        hold_early: bool = True,
    ) -> None:
        base = URL(api)
        if not base.is_absolute() or base.scheme not in ("http", "https") or not base.host:
            raise ValueError(f"api {safe_url(api)!r} must be an absolute http(s) URL")
        if base.query_string or base.fragment:
            raise ValueError(f"api {safe_url(api)!r}: the base URL of the API, without a query or fragment")
        if isinstance(max_body, bool) or not isinstance(max_body, int) or not 0 < max_body <= MAX_BODY_LIMIT:
            raise ValueError(f"max_body must be a number of bytes from 1 to {MAX_BODY_LIMIT}, not {max_body!r}")
        if isinstance(max_pages, bool) or not isinstance(max_pages, int) or not 0 < max_pages <= MAX_PAGES_LIMIT:
            raise ValueError(f"max_pages must be a whole number from 1 to {MAX_PAGES_LIMIT}, not {max_pages!r}")
        if not search_lag_s >= 0:
            raise ValueError(f"search_lag must not be negative, not {search_lag_s!r}")
        self.api = base
        self.name = name
        self.search_lag_s = float(search_lag_s)
        self.lands_within_s = float(lands_within_s)
        self.max_body = max_body
        self.max_pages = max_pages
        # False when the target's own lands_within already includes search_lag (a kind declared in
        # the targets file): then ``judge`` holds an early "absent" without using up a try, and the
        # effect's caller waits (EffectInProgress) instead of being told the outcome is unknown.
        self.hold_early = hold_early
        self._headers = dict(headers or {})
        self._timeout_s = timeout
        # Wall-clock epoch ms: when the index can be trusted is the destination's time, not the log's.
        self._clock = clock or (lambda: int(time.time() * 1000))

    @property
    def timeout_s(self) -> float:
        """How long one lookup (every page of it) may take."""
        return self._timeout_s

    def conclusive_from_ms(self, effect: EffectView) -> int:
        """From when an empty search proves absence: the latest moment the attempt's call could take
        effect (its deadline plus ``lands_within``), plus the index's lag."""
        return effect.deadline_ms + int((self.lands_within_s + self.search_lag_s) * 1000)

    @abstractmethod
    def first_url(self, key: str) -> URL:
        """The search for ``key``, first page."""

    @abstractmethod
    def read_page(self, asked: URL, body: Any, key: str) -> Reading:
        """One answer to the search page ``asked``: which page it says it is, whether it is in the
        kind's shape, its matches and next page."""

    async def check(self, effect: EffectView) -> Answer:
        """Search every page for the key: Found with the destination's own id, Absent only when the
        search is complete and conclusive (the lag has passed), else Unknown. Never raises for a
        network failure, a timeout, a redirect, an oversized or malformed answer."""
        import aiohttp  # see HttpReconciler.check: most programs never ask a destination

        key = effect.effect_id
        url = self.first_url(key)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s)) as s:
                for _ in range(self.max_pages):
                    got = await self._get(s, url)
                    if isinstance(got, Unknown):
                        return got
                    if isinstance(got, Provenance):  # a redirect, a body not JSON: refused as evidence
                        return admit(Absent("nothing readable was found"), got)
                    reading = self.read_page(url, got, key)
                    prov = Provenance(reading.asked, reading.answered, shape_error=reading.shape_error)
                    page = reading.page
                    if page is None or reading.shape_error is not None:
                        return admit(Absent("the answer could not be read"), prov)
                    if page.matches:
                        receipt, obj = page.matches[0]
                        return admit(Found(receipt, obj), prov)
                    if page.next_url is None:
                        break
                    if origin(page.next_url) != origin(self.api):
                        return Unknown(
                            f"GET {safe_url(str(url))}: the next page is on another origin "
                            f"({safe_url(str(page.next_url))}); not asked"
                        )
                    url = page.next_url
                else:
                    return Unknown(f"search for {key!r}: more than {self.max_pages} pages (max_pages); not an answer")
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return Unknown(f"GET {safe_url(str(url))}: {type(e).__name__}: {scrub(str(e), url)}")
        now = self._clock()
        conclusive = self.conclusive_from_ms(effect)
        if self.hold_early and now < conclusive:
            return Unknown(
                f"not found by search yet, but the index may lag: an empty search is conclusive from {conclusive} "
                f"(deadline + lands_within {self.lands_within_s:g} s + search_lag {self.search_lag_s:g} s)"
            )
        absent = Absent(f"no object carries the key (a complete search; the index lags up to {self.search_lag_s:g} s)")
        return admit(absent, prov)

    async def _get(self, s: aiohttp.ClientSession, url: URL) -> Any:
        """The JSON body of a 200 answer from the API's own origin, or Unknown: any other status (a
        search that fails says nothing about the key), a redirect (never followed), a body over
        ``max_body``, not JSON."""
        async with s.get(url, headers=self._headers, allow_redirects=False) as resp:
            if 300 <= resp.status < 400:
                # Never followed for a search (the API key would go with it), and never evidence.
                where = safe_url(resp.headers.get("Location", "(nowhere)"))
                return Provenance(str(url), f"HTTP {resp.status} redirect to {where}", redirected=True)
            body = await _read_bounded(resp, self.max_body)
            if body is None:
                return Unknown(
                    f"GET {safe_url(str(url))}: HTTP {resp.status}: answer over {self.max_body} bytes (max_body)"
                )
            if resp.status != 200:
                said = scrub(body[:200].decode("utf-8", "replace"), url)
                return Unknown(f"GET {safe_url(str(url))}: HTTP {resp.status}: {said}")
            if resp.content_type != "application/json":
                return Provenance(str(url), str(url), shape_error=f"HTTP 200 as {resp.content_type!r}, not JSON")
            try:
                return json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError):
                return Provenance(str(url), str(url), shape_error="HTTP 200 with a body that is not JSON")


__all__ = ["DEFAULT_MAX_PAGES", "KeySearch", "MAX_PAGES_LIMIT", "Page", "Reading"]
