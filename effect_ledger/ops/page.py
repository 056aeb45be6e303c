"""Paging the stuck scan: ``effects stuck --webhook URL`` posts what it found.

Three bodies: ``slack`` (an incoming webhook's ``{"text": ...}``), ``pagerduty`` (an Events API v2
``trigger`` with a routing key) and ``json`` (the rows as data). Every body is bounded: at most
``MAX_LISTED`` effects are listed (the count says how many there are), each reason cut to
``MAX_REASON`` characters, the whole body under ``MAX_BODY`` bytes. The post never hangs (one
total timeout covers connecting, redirects and the answer) and follows a redirect only within the
webhook's own origin (scheme, host and port): the body is never handed to another server.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

from effect_ledger.core.timeparse import iso
from effect_ledger.ops.views import Row

FORMATS = ("slack", "pagerduty", "json")
MAX_LISTED = 20  # effects named in one page; the rest are counted
MAX_REASON = 200  # characters of a reason
MAX_BODY = 16 * 1024  # bytes of a posted body
MAX_REDIRECTS = 3  # same-origin hops
DEFAULT_TIMEOUT_S = 10.0


class PageError(Exception):
    """The page was not delivered; the message is one line without the URL's secret path."""


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``: what messages show (a Slack URL's path is its secret)."""
    p = urlsplit(url)
    port = p.port or (443 if p.scheme == "https" else 80)
    return f"{p.scheme}://{p.hostname}:{port}"


def check_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host; ``ValueError`` (one line) otherwise."""
    p = urlsplit(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"--webhook {url.split('?')[0][:80]!r}: give an http:// or https:// URL")
    return url


def _clip(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _summary(rows: Sequence[Row], older_than: str) -> str:
    return f"effect-ledger: {len(rows)} effects stuck for longer than {older_than} on {socket.gethostname()}"


def _listed(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [
        {
            "effect_id": r.effect_id,
            "state": r.state,
            "target": r.target,
            "operation": r.operation,
            "attempt": r.attempt,
            "since": iso(r.created_ms),
            "reason": _clip(r.reason, MAX_REASON),
        }
        for r in rows[:MAX_LISTED]
    ]


def payload(rows: Sequence[Row], fmt: str, older_than: str, routing_key: str | None = None) -> dict[str, Any]:
    """The body for ``fmt``; ``ValueError`` for a PagerDuty page without a routing key."""
    summary = _summary(rows, older_than)
    listed = _listed(rows)
    more = len(rows) - len(listed)
    if fmt == "slack":
        lines = [f"• {e['effect_id']} {e['state']} {e['target']}/{e['operation']} since {e['since']}" for e in listed]
        if more:
            lines.append(f"… and {more} more (effects stuck --older-than {older_than})")
        return {"text": "\n".join([summary, *lines])}
    if fmt == "pagerduty":
        if not routing_key:
            raise ValueError("--webhook-format pagerduty needs --routing-key (or EFFECTS_PAGERDUTY_ROUTING_KEY)")
        return {
            "routing_key": routing_key,
            "event_action": "trigger",
            "dedup_key": f"effect-ledger-stuck-{socket.gethostname()}",  # one open incident, not one per run
            "payload": {
                "summary": _clip(summary, 1024),
                "source": socket.gethostname(),
                "severity": "critical",
                "component": "effect-ledger",
                "custom_details": {"stuck": len(rows), "older_than": older_than, "effects": listed, "more": more},
            },
        }
    return {"stuck": len(rows), "older_than": older_than, "effects": listed, "more": more}


def encode(body: dict[str, Any]) -> bytes:
    """JSON bytes, bounded by ``MAX_BODY`` (the listed effects are bounded, so this is a guard)."""
    data = json.dumps(body, ensure_ascii=False).encode()
    if len(data) > MAX_BODY:
        raise PageError(f"the page body is {len(data):,} bytes, over the {MAX_BODY:,}-byte bound")
    return data


async def _post(url: str, data: bytes, timeout_s: float) -> int:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    home = origin(url)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(MAX_REDIRECTS + 1):
            async with session.post(
                url, data=data, headers={"Content-Type": "application/json"}, allow_redirects=False
            ) as resp:
                if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                    nxt = urljoin(url, resp.headers["Location"])
                    if origin(nxt) != home:
                        raise PageError(f"{home} redirected to {origin(nxt)}: not followed (another origin)")
                    url = nxt
                    continue
                await resp.content.read(4096)  # a bounded look at the answer; the status decides
                if not 200 <= resp.status < 300:
                    raise PageError(f"{home} answered HTTP {resp.status}")
                return resp.status
    raise PageError(f"{home} redirected more than {MAX_REDIRECTS} times")


def post(url: str, body: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """POST ``body`` as JSON to ``url``; the 2xx status, or ``PageError`` (one line) when it was
    not delivered: refused, timed out, an error status, a redirect to another origin."""
    data = encode(body)
    try:
        return asyncio.run(asyncio.wait_for(_post(url, data, timeout_s), timeout_s + 1))
    except PageError:
        raise
    except TimeoutError:
        raise PageError(f"{origin(url)} did not answer within {timeout_s:g} s") from None
    except Exception as e:  # aiohttp's connection errors and the like: one line, no URL path
        said = " ".join(str(e).replace(url, origin(url)).split())[:200]
        raise PageError(f"{origin(url)}: {type(e).__name__}: {said}") from None
