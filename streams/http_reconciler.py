"""Built-in reconcilers. The interface (``Reconciler``: ``check(EffectView) -> Found | Absent |
Unknown``) and the callable reconciler live in ``effect_ledger.streams.reconcile``; this adds HTTP."""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from effect_ledger.streams.reconcile import Absent, Answer, CallableReconciler, EffectView, Found, Unknown

__all__ = ["HttpReconciler", "CallableReconciler"]


class HttpReconciler:
    """Asks an HTTP endpoint about one idempotency key.

    ``url``: a template with ``{key}`` (URL-quoted), and optionally ``{target}``/``{operation}``,
    e.g. ``https://gateway/refunds/by-key/{key}``. Status codes map to answers: ``found_status``
    (default 200) -> Found, ``absent_status`` (default 404, 410) -> Absent, anything else (5xx,
    501, a timeout) -> Unknown. On Found, ``receipt_field`` (a dotted path into the JSON body) is the
    receipt id. If ``state_field`` is set, its value refines a found-status answer: values in
    ``absent_values`` mean Absent (e.g. a refund that failed), in ``pending_values`` Unknown.
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
        timeout: float = 10.0,
    ) -> None:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(url) if f is not None}
        except ValueError as e:
            raise ValueError(f"reconciler url {url!r}: {e}") from None
        if "key" not in fields or not fields <= {"key", "target", "operation"}:
            raise ValueError(f"reconciler url {url!r} must contain {{key}} (and may use {{target}}, {{operation}})")
        self.url = url
        self.name = name
        self._found = frozenset(found_status)
        self._absent = frozenset(absent_status)
        self._receipt_field = receipt_field
        self._state_field = state_field
        self._absent_values = frozenset(absent_values)
        self._pending_values = frozenset(pending_values)
        self._headers = dict(headers or {})
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    def url_for(self, effect: EffectView) -> str:
        return self.url.format(key=quote(effect.effect_id, safe=""), target=effect.target, operation=effect.operation)

    async def check(self, effect: EffectView) -> Answer:
        url = self.url_for(effect)
        try:
            async with aiohttp.ClientSession(timeout=self._timeout, headers=self._headers) as s:
                async with s.get(url) as resp:
                    status = resp.status
                    text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            return Unknown(f"GET {url}: {type(e).__name__}: {e}")
        return self.interpret(status, text)

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


def _dig(body: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(body, dict):
            return None
        body = body.get(part)
    return body
