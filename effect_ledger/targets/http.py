"""Built-in reconcilers. The interface (``Reconciler``: ``check(EffectView) -> Found | Absent |
Unknown``) and the callable reconciler live in ``effect_ledger.core.reconcile``; this adds HTTP."""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from yarl import URL

from effect_ledger.targets.evidence import MAX_REDIRECTS, Provenance, Redirects, admit, origin, redirect_refusal
from effect_ledger.targets.keyurl import key_url

if TYPE_CHECKING:
    import aiohttp

from effect_ledger.core.reconcile import Absent, Answer, EffectView, Found, Unknown
from effect_ledger.core.urls import safe_url, scrub
from effect_ledger.targets.ask import DEFAULT_ASK_TIMEOUT_S, CallableReconciler

__all__ = ["HttpReconciler", "CallableReconciler", "DEFAULT_MAX_BODY", "MAX_BODY_LIMIT"]

DEFAULT_MAX_BODY = 256 << 10  # a found answer goes into a resolution event, which must fit a Kafka record
MAX_BODY_LIMIT = 16 << 20  # the most ``max_body`` may be set to
_REDIRECT = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 << 10


class HttpReconciler:
    """Asks an HTTP endpoint about one idempotency key.

    ``url``: a template with ``{key}`` and optionally ``{target}``/``{operation}``, e.g.
    ``https://gateway/refunds/by-key/{key}``; the key is percent-encoded as one path segment
    (``effect_ledger.core.keys.key_path_segment``: dots too), and may not be in the host.
    Status codes map to answers: ``found_status`` (default 200) -> Found, ``absent_status`` (default
    404, 410) -> Absent, anything else (5xx, 501, a timeout) -> Unknown. On Found, ``receipt_field``
    (a dotted path into the JSON body) is the receipt id. If ``state_field`` is set, its value refines
    a found-status answer: values in ``absent_values`` mean Absent (e.g. a refund that failed), in
    ``pending_values`` Unknown.

    Only the configured destination's own answer counts (``effect_ledger.targets.evidence``): an
    answer after a redirect is Unknown, never Absent and never a receipt. A redirect is not followed
    (Unknown, with where it pointed), unless ``redirects="same-origin"``, which follows up to 5
    redirects that stay on the URL's scheme, host and port so that the Unknown's reason can say what
    the final page answered; a redirect elsewhere is never followed. ``headers``
    (e.g. an API key) are sent to that origin only. The body is read up to ``max_body`` bytes
    (default 256 KiB, at most 16 MiB); a longer answer is Unknown and is not read further.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "http",
        found_status: Iterable[int] = (200,),
        absent_status: Iterable[int] = (404, 410),
        receipt_field: str = "id",
        state_field: str | None = None,
        absent_values: Iterable[str] = (),
        pending_values: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT_S,
        redirects: Redirects = "none",
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(url) if f is not None}
        except ValueError as e:
            raise ValueError(f"reconciler url {safe_url(url)!r}: {e}") from None
        if "key" not in fields or not fields <= {"key", "target", "operation"}:
            raise ValueError(
                f"reconciler url {safe_url(url)!r} must contain {{key}} (and may use {{target}}, {{operation}})"
            )
        # The origin must not depend on the key: it is where the headers go and whose answer counts.
        one, other = (key_url(url, k, target="t", operation="o") for k in ("a", "b"))
        if not one.is_absolute() or origin(one) != origin(other):
            raise ValueError(f"reconciler url {safe_url(url)!r}: an absolute URL with {{key}} in its path or query")
        if redirects not in ("none", "same-origin"):
            raise ValueError(f"redirects must be 'none' or 'same-origin', not {redirects!r}")
        if isinstance(max_body, bool) or not isinstance(max_body, int) or not 0 < max_body <= MAX_BODY_LIMIT:
            raise ValueError(f"max_body must be a number of bytes from 1 to {MAX_BODY_LIMIT}, not {max_body!r}")
        self.url = url
        self.name = name
        self.redirects: Redirects = redirects
        self.max_body = max_body
        self._found = frozenset(found_status)
        self._absent = frozenset(absent_status)
        self._receipt_field = receipt_field
        self._state_field = state_field
        self._absent_values = frozenset(absent_values)
        self._pending_values = frozenset(pending_values)
        self._headers = dict(headers or {})
        self._timeout_s = timeout

    @property
    def timeout_s(self) -> float:
        """How long one lookup may take (the target's ``timeout``)."""
        return self._timeout_s

    def url_for(self, effect: EffectView) -> str:
        """The URL ``check`` would GET for this effect, with its key filled in and percent-encoded."""
        return str(self._url(effect))

    def _url(self, effect: EffectView) -> URL:
        return key_url(self.url, effect.effect_id, target=effect.target, operation=effect.operation)

    async def check(self, effect: EffectView) -> Answer:
        """GET the effect's URL and map the reply to Found, Absent or Unknown.

        Never raises for a network failure, a timeout, a refused redirect or an oversized body: each
        of those is an Unknown with the reason.
        """
        # Imported here, not at the top: aiohttp is most of the import time of `import effect_ledger`,
        # and most programs that import it never ask a destination.
        import aiohttp

        url = self._url(effect)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s)) as s:
                return await self._ask(s, url)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            # The reason is written into the ledger's events: the URL's password and query values stay out.
            return Unknown(f"GET {safe_url(str(url))}: {type(e).__name__}: {scrub(str(e), url)}")

    async def _ask(self, s: aiohttp.ClientSession, url: URL) -> Answer:
        asked, home = url, origin(url)
        # Redirects are taken one at a time so that each is checked before anything (the headers
        # included) is sent to where it points.
        for hop in range(MAX_REDIRECTS + 1):
            async with s.get(url, headers=self._headers, allow_redirects=False) as resp:
                status = resp.status
                if status not in _REDIRECT:
                    body = await _read_bounded(resp, self.max_body)
                    if body is None:
                        return Unknown(
                            f"GET {safe_url(str(url))}: HTTP {status}: answer over {self.max_body} bytes (max_body)"
                        )
                    charset = resp.charset or "utf-8"
                    try:
                        text = body.decode(charset)
                    except (LookupError, UnicodeDecodeError):
                        return Unknown(
                            f"GET {safe_url(str(url))}: HTTP {status} with a body that is not {charset} text"
                        )
                    answer = self.interpret(status, text)
                    if isinstance(answer, Unknown):  # an error page may quote the URL asked, token and all
                        answer = Unknown(scrub(answer.reason, url, asked))
                    return admit(answer, Provenance(str(asked), str(url), redirected=hop > 0))
                location = resp.headers.get("Location", "")
            try:
                # As sent: decoding it would turn an encoded "%2E%2E" into a step up.
                nxt = url.join(URL(location, encoded=True)) if location else None
            except ValueError:
                nxt = None
            why = redirect_refusal(self.redirects, nxt, home, hop)
            if why is not None:
                where = safe_url(location) if location else "(nowhere)"
                return Unknown(f"GET {safe_url(str(url))}: HTTP {status} redirect to {where}: {scrub(why, nxt or '')}")
            assert nxt is not None
            url = nxt
        raise AssertionError("unreachable: the last hop is never followed")

    def interpret(self, status: int, text: str) -> Answer:
        """Map one HTTP reply to an answer (separate from I/O so the mapping is testable)."""
        if status in self._absent:
            return Absent(f"HTTP {status}")
        if status not in self._found:
            return Unknown(f"HTTP {status}: {text[:200]}")
        try:
            body = json.loads(text)
        except json.JSONDecodeError:
            return Unknown(f"HTTP {status} with a body that is not JSON")
        if self._state_field is not None:
            value = str(_dig(body, self._state_field))
            if value in self._absent_values:
                return Absent(f"{self._state_field}={value}")
            if value in self._pending_values:
                return Unknown(f"{self._state_field}={value}")
        receipt = _dig(body, self._receipt_field)
        if receipt is None:
            return Unknown(f"HTTP {status} without field {self._receipt_field!r}")
        return Found(str(receipt), body)


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None when it is longer than ``limit`` bytes (then at most about ``limit`` plus
    one chunk was read, and the connection is closed rather than drained)."""
    declared = resp.content_length
    if declared is not None and declared > limit and not resp.headers.get("Content-Encoding"):
        resp.close()
        return None
    buf = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        buf += chunk
        if len(buf) > limit:  # decompressed bytes: a compressed bomb stops here too
            resp.close()
            return None
    return bytes(buf)


def _dig(body: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(body, dict):
            return None
        body = body.get(part)
    return body
