"""Recording and reading request bodies under a target's body policy (``core.bodies``): what an
intent stores (the request as is, redacted, withheld, or sealed under its subject's key) and what a
reconciler is shown (a sealed body opened while its key exists)."""

from __future__ import annotations

import json
from typing import Any

from effect_ledger.core.bodies import WITHHELD, BodyMode, BodyPolicy, canonical_text, redacted, subject_of
from effect_ledger.core.limits import MAX_REQUEST_BYTES
from effect_ledger.errors import BodyErased, EffectTooLarge, InvalidEffect, MissingExtra
from effect_ledger.sdk import erasure
from effect_ledger.sdk.erasure import Keyring


async def stored(
    policy: BodyPolicy, keyring: Keyring, effect_id: str, canonical: str, request_digest: str, now_ms: int
) -> str:
    """The request text to record in the intent under ``policy``."""
    if policy.mode is BodyMode.FULL:
        return canonical
    if policy.mode is BodyMode.DIGEST:
        return canonical_text({WITHHELD: {"sha256": request_digest}})
    if policy.mode is BodyMode.REDACT:
        text = canonical_text(redacted(json.loads(canonical), policy.redact))
        size = len(text.encode())
        if size > MAX_REQUEST_BYTES:  # many tiny redacted values can outgrow the request itself
            raise EffectTooLarge("request (redacted)", size, MAX_REQUEST_BYTES)
        return text
    subject = subject_of(policy, effect_id, canonical)
    kid, key = await keyring.key_for(subject, now_ms)
    return erasure.seal(kid, key, effect_id, request_digest, canonical)


async def readable_request(keyring: Keyring, effect_id: str, request: str, request_digest: str) -> Any:
    """The request a reconciler is shown: a sealed body opened when ``keyring`` has its key (still
    sealed once erased), any other body decoded as recorded."""
    if erasure.is_sealed(request):
        try:
            return await erasure.open_body(keyring, effect_id, request, request_digest)
        except (BodyErased, MissingExtra, InvalidEffect):
            pass
    return json.loads(request)


__all__ = ["stored", "readable_request"]
