"""Asking the ledger processor about a key (Kafka mode, an agent restarted on another host, the
verdict on a claim).

Any worker answers for any key (it forwards to the owner of the key's partition), so an agent may
name several: a worker that cannot answer (paused, cut off from the brokers, rejoining its group,
still recovering its table) is passed over for the next one, instead of every call of the agent
waiting for that one worker for its whole ``sync_timeout``."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from effect_ledger.core.urls import credentials_in, safe_url
from effect_ledger.errors import ConfigError, EffectRetired, LedgerLagging, LedgerUnavailable
from effect_ledger.targets.keyurl import key_url

TOKEN_ENV = "EFFECTS_WEB_TOKEN"
_MAX_OFFSET = 2**63 - 1
#: Most workers one lookup setting may name, and the longest URL of one.
MAX_LOOKUP_URLS = 16
MAX_LOOKUP_URL_CHARS = 2048
#: How long a lookup waits for the worker it asked before it asks the next one too. A live worker
#: answers a claim's lookup within milliseconds, about a second and a half at worst under faults; a
#: paused worker, or one behind a network cut, never answers, and its connection still opens (the
#: kernel accepts it), so only a wait tells it apart. At most ``_AT_ONCE`` workers are asked at a
#: time: every worker forwards to the same owner of the key's partition, and each request more is
#: one more lookup the owner holds while it catches up.
HEDGE_S = 1.0
_AT_ONCE = 2
#: A worker that has not answered a lookup in this long is given up on (with several workers; one
#: alone gets the whole request timeout): a live one answers within the processor's lookup bound
#: (``lookup_bound_s``, 5 s by default), at the latest with "lagging".
SILENT_S = 6.0


def lookup_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """The workers a ``lookup`` setting names: one URL, several separated by commas, or a list of
    them (in the order to ask them). Raises ``ConfigError`` for anything else: no URL, more than
    ``MAX_LOOKUP_URLS``, one longer than ``MAX_LOOKUP_URL_CHARS``, one that is not
    ``http(s)://host[:port][/path]`` (no query, fragment, white space or control character), or one
    with a user name or password (the lookup token is the credential; the message hides it)."""
    if isinstance(urls, str):
        if len(urls) > MAX_LOOKUP_URLS * (MAX_LOOKUP_URL_CHARS + 1):
            raise ConfigError(f"lookup is {len(urls):,} characters long; at most {MAX_LOOKUP_URLS} URLs")
        parts: Sequence[object] = urls.split(",")
    elif isinstance(urls, bytes) or not isinstance(urls, Sequence):
        raise ConfigError(f"lookup must be a URL, several separated by commas or a list, got {type(urls).__name__}")
    else:
        parts = urls
    if len(parts) > MAX_LOOKUP_URLS * 4:  # a few empty entries (a trailing comma) are let through
        raise ConfigError(f"lookup names {len(parts):,} URLs; at most {MAX_LOOKUP_URLS}")
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ConfigError(f"lookup URLs must be strings, not {type(part).__name__}")
        u = part.strip().rstrip("/")
        if not u:
            continue
        shown = safe_url(u[:200])
        if len(u) > MAX_LOOKUP_URL_CHARS:
            raise ConfigError(f"lookup URL longer than {MAX_LOOKUP_URL_CHARS} characters: {shown[:80]}...")
        if credentials_in(u):
            raise ConfigError(
                f"lookup URL {shown!r} carries a user name or password: give the lookup token instead "
                f"(Ledger.open(lookup_token=...) or {TOKEN_ENV})"
            )
        if any(c in u for c in "?#") or any(not c.isprintable() or c.isspace() for c in u):
            raise ConfigError(f"lookup URL {shown!r} has a query, a fragment, white space or a control character")
        try:
            parsed = URL(u)
        except ValueError as e:
            raise ConfigError(f"lookup URL {shown!r} is not a URL: {e}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigError(f"lookup URL {shown!r} must be http(s)://host[:port][/path]")
        if u not in out:
            out.append(u)
            if len(out) > MAX_LOOKUP_URLS:
                raise ConfigError(f"lookup names more than {MAX_LOOKUP_URLS} URLs")
    if not out:
        raise ConfigError("lookup names no URL")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class FoldedThrough:
    """What a lookup waits for: the processor has folded the key's ``partition`` of effects.events
    through offset ``events`` (and of effects.decisions through ``decisions``; -1: nothing). An agent
    that wrote an intent knows its offset: the answer then holds the verdict on its claim."""

    partition: int
    events: int
    decisions: int = -1

    def params(self) -> dict[str, str]:
        """The query parameters that ask for it."""
        return {"partition": str(self.partition), "offset": str(self.events), "decisions_offset": str(self.decisions)}

    def query(self) -> str:
        """The same, to append to a query string (``?...``)."""
        return "".join(f"&{k}={v}" for k, v in self.params().items())


def folded_through_asked(query: Mapping[str, str], partition: int) -> FoldedThrough | str | None:
    """The ``FoldedThrough`` a lookup request asks for (None: none, wait for the high watermarks),
    or why the request is refused (the offsets are not numbers, or name another partition than the
    key's: the answer would not cover the agent's intent)."""
    if "offset" not in query:
        return None
    try:
        p = int(query.get("partition", ""))
        events = int(query["offset"])
        decisions = int(query.get("decisions_offset", "-1"))
    except ValueError:
        return "partition, offset and decisions_offset must be integers"
    if p != partition:
        return f"the key is on partition {partition}, not {p}"
    if not (-1 <= events <= _MAX_OFFSET and -1 <= decisions <= _MAX_OFFSET):
        return "offsets must be between -1 and 2**63-1"
    return FoldedThrough(p, events, decisions)


class ProcessorLookup:
    """``GET {url}/effects/{key}`` on a processor worker (it routes to the owner of the key).

    ``url``: one worker, or several (``lookup_urls``, every one a worker of the same processor): the
    one that answered last is asked first, and the next one too when the first refuses for now
    (``LedgerLagging``, a connection that fails) or has not answered in ``HEDGE_S``; the first
    answer is kept (``_ask_each``). ``token``: the processor's
    lookup token (``effects worker --web-token`` / ``EFFECTS_WEB_TOKEN``, one for every worker),
    sent as ``Authorization: Bearer``; by default read from ``EFFECTS_WEB_TOKEN``."""

    def __init__(
        self,
        url: str | Sequence[str],
        timeout: float = 15.0,
        token: str | None = None,
        watermarks: Callable[[str], Awaitable[FoldedThrough]] | None = None,
        on_close: Callable[[], None] | None = None,
        hedge_s: float = HEDGE_S,
        silent_s: float = SILENT_S,
    ) -> None:
        self.urls = lookup_urls(url)
        self._templates = tuple(u.replace("{", "{{").replace("}", "}}") + "/effects/{key}" for u in self.urls)
        self._first = 0  # the worker that answered last: asked first
        self._hedge_s, self._silent_s = hedge_s, silent_s
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        token = os.environ.get(TOKEN_ENV) if token is None else token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None
        # Where a key's partition stands on Kafka (claims.Watermarks.of): a lookup then names the
        # offsets it waits for. None: the processor asks the broker itself (slower).
        self._watermarks = watermarks
        self._on_close = on_close

    @property
    def url(self) -> str:
        """The worker asked first."""
        return self.urls[self._first]

    async def events(self, key: str, after: FoldedThrough | None = None) -> list[bytes]:
        """The key's events as the processor's table holds them ([] when it knows none), once it has
        folded ``after`` (by default: what Kafka had acknowledged when it was asked). Raises
        ``LedgerLagging`` when the processor has not caught up with what Kafka acknowledged, and
        ``LedgerUnavailable`` when it cannot be asked, or answers anything but an answer about this
        very key: never an empty answer it cannot vouch for. With several workers, these come only
        once none of them could answer (the message gives each one's reason); a refusal that will
        not pass (a token refused, an answer about another key, a retired key) comes at once."""
        if after is None and self._watermarks is not None:
            after = await self._watermarks(key)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        if len(self.urls) == 1:
            return await self._ask(self._session, 0, key, after)
        return await self._ask_each(self._session, key, after)

    async def _ask_each(self, session: aiohttp.ClientSession, key: str, after: FoldedThrough | None) -> list[bytes]:
        """The first answer of the workers, asked in turn from the one that answered last: the next
        one as soon as one refuses for now or is given up on (``SILENT_S``), or alongside one that
        has not answered in ``HEDGE_S``; at most ``_AT_ONCE`` at a time."""
        n = len(self.urls)
        order = [(self._first + i) % n for i in range(n)]
        clock = asyncio.get_running_loop().time
        asking: dict[asyncio.Task[list[bytes]], tuple[int, float]] = {}  # -> (worker, asked at)
        dropped: list[asyncio.Task[list[bytes]]] = []
        refused: list[str] = []  # each worker's reason, or that it did not answer
        lagging = False
        cause: LedgerUnavailable | None = None
        asked = 0

        def ask_next() -> None:
            nonlocal asked
            i = order[asked]
            asked += 1
            asking[asyncio.ensure_future(self._ask(session, i, key, after))] = (i, clock())

        ask_next()
        try:
            while asking:
                hedge = asked < n and len(asking) < _AT_ONCE
                oldest, newest = min(t for _, t in asking.values()), max(t for _, t in asking.values())
                wake = min(oldest + self._silent_s, newest + self._hedge_s if hedge else float("inf"))
                done, _ = await asyncio.wait(
                    asking, timeout=max(0.0, wake - clock()), return_when=asyncio.FIRST_COMPLETED
                )
                ended = 0
                for t in sorted(done, key=lambda t: order.index(asking[t][0])):  # in the order asked
                    i, _ = asking.pop(t)
                    try:
                        events = t.result()  # a refusal that will not pass is raised here
                    except LedgerUnavailable as e:
                        if not e.passing:
                            raise
                        refused.append(str(e))
                        lagging = lagging or isinstance(e, LedgerLagging)
                        cause = cause or e
                        ended += 1
                        continue
                    self._first = i
                    return events
                now = clock()
                for t, (i, at) in list(asking.items()):
                    if now - at >= self._silent_s:  # given up on: the next worker is asked instead
                        t.cancel()
                        del asking[t]
                        dropped.append(t)
                        refused.append(f"the ledger processor at {self.urls[i]} did not answer in {self._silent_s:g} s")
                        ended += 1
                if not done and not ended and hedge:
                    ended = 1  # no answer yet: ask the next worker too
                for _ in range(ended):
                    if asked < n and len(asking) < _AT_ONCE:
                        ask_next()
        finally:
            rest = [*asking, *dropped]
            for t in rest:
                t.cancel()
            if rest:
                await asyncio.gather(*rest, return_exceptions=True)
        err = LedgerLagging if lagging else LedgerUnavailable
        why = "; ".join(refused)
        raise err(f"none of the {n} ledger processor workers could answer: {why}", passing=True) from cause

    async def _ask(self, session: aiohttp.ClientSession, i: int, key: str, after: FoldedThrough | None) -> list[bytes]:
        """One worker's answer about ``key``."""
        base = self.urls[i]
        try:
            url = key_url(self._templates[i], key)
            if after is not None:
                url = url.update_query(after.params())
            # No redirects: an answer from elsewhere is not the processor's, and the token stays here.
            async with session.get(url, headers=self._headers, allow_redirects=False) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as e:
            raise LedgerUnavailable(
                f"cannot ask the ledger processor at {base}: {type(e).__name__}: {e}", passing=True
            ) from e
        if status == 401:
            raise LedgerUnavailable(
                f"the ledger processor at {base} refused the lookup (401): give its token "
                f"(Ledger.open(lookup_token=...) or {TOKEN_ENV})"
            )
        if status == 503 and isinstance(body, dict) and body.get("lagging"):
            raise LedgerLagging(_lagging(body, base))
        return _events_of(status, body, key, base)

    async def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def _events_of(status: int, body: Any, key: str, url: str) -> list[bytes]:
    """Accept only the processor's answer about ``key``: 200 with its events, or 404 "not known".
    Anything else (another effect, no effect named, a page that is not the lookup view) is an error:
    reading it as "unknown key" would let this host execute again what another host did."""

    def refuse(why: str) -> LedgerUnavailable:
        return LedgerUnavailable(f"ledger processor at {url} answered {status} for {key}, {why}: {str(body)[:200]}")

    if not isinstance(body, dict):
        raise refuse("not a lookup answer")
    if body.get("effect_id") != key:
        raise refuse(f"about {body.get('effect_id')!r}, not the effect asked for")
    if status == 404 and body.get("known") is False:
        return []
    if status == 410 and body.get("retired") is True:
        # Retired (effect_ledger/core/retention.py): never executed again, whatever its last state.
        raise EffectRetired(key, str(body.get("state")), int(body.get("retired_ms") or 0))
    events = body.get("events")
    if status != 200 or body.get("known") is not True or not isinstance(events, list):
        raise refuse("not a lookup answer")
    try:
        return [base64.b64decode(e, validate=True) for e in events]
    except (binascii.Error, TypeError, ValueError) as e:
        raise refuse(f"events that are not base64 ({e})") from e


def _lagging(body: dict[str, Any], url: str) -> str:
    """Why the processor could not answer yet, in its own words: the offsets when it gave them,
    else its reason (starting, no owner of the partition, a silent peer, a slow broker)."""
    where = f"partition {body['partition']}" if body.get("partition") is not None else "the key's partition"
    if body.get("processed") is not None and body.get("high_watermark") is not None:
        return (
            f"the ledger processor at {url} lags on {where}: consumed through offset {body['processed']}, "
            f"high watermark {body['high_watermark']}"
        )
    reason = str(body.get("reason") or "no reason given")[:300]
    return f"the ledger processor at {url} cannot answer for {where} yet: {reason}"
