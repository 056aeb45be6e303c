"""Erasable request bodies (crypto-shredding): a body encrypted with its subject's key, and the key
kept apart from the events, where it can be deleted.

A target declared with ``body = "encrypt"`` (``effect_ledger.core.bodies``) has every request
body sealed before the intent is written: AES-256-GCM under a key of the *subject* the request
names (``subject = "customer.id"``: the value at that path; without it, the effect key itself),
bound to the effect key and the request digest (the associated data), so a sealed body cannot be
moved to another effect. What travels in the intent, to the file and to ``effects.events``, is::

    {"effect_ledger.sealed":{"alg":"A256GCM","ct":"<base64>","kid":"<key id>","nonce":"<base64>"}}

The keys live in the ledger file's ``erasure_keys`` table: a random key id (it says nothing about
the subject), the SHA-256 of the subject (to find its keys when it is erased) and the key.
``erase(store, subject)`` deletes the subject's keys, overwriting them on disk (``secure_delete``,
then a WAL truncation): from then on every body sealed under them is unreadable everywhere it was
copied (the file, ``effects.events``, a backup of the topic), and ``open_body`` raises
``BodyErased``. Nothing else changes: states, times, attempts, receipt ids and request digests
stay, so the audit still proves what happened, when, and that a retry carried the same request
(the digest), but no longer what the request said.

Requires the ``[erasure]`` extra (``cryptography``), imported only when a body is sealed or opened.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
from typing import TYPE_CHECKING, Any, Protocol

from effect_ledger._extras import require
from effect_ledger.errors import BodyErased, InvalidEffect

if TYPE_CHECKING:
    from effect_ledger.sdk.store.sqlite import Store

SEALED = "effect_ledger.sealed"
SEALED_PREFIX = '{"' + SEALED + '":'
ALG = "A256GCM"


def subject_digest(subject: str) -> str:
    return hashlib.sha256(f"effect-ledger subject\0{subject}".encode()).hexdigest()


def _aad(effect_id: str, request_digest: str) -> bytes:
    return f"effect-ledger\0{effect_id}\0{request_digest}".encode()


def _aesgcm(key: bytes) -> Any:
    require("erasure", 'encrypted request bodies (body = "encrypt")')
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


async def key_for(store: Store, subject: str, now_ms: int) -> tuple[str, bytes]:
    """The subject's current key (kid, key), created on first use."""
    require("erasure", 'encrypted request bodies (body = "encrypt")')
    sd = subject_digest(subject)

    def run(conn: sqlite3.Connection) -> tuple[str, bytes]:
        row = conn.execute(
            "SELECT kid, key FROM erasure_keys WHERE subject_digest = ? ORDER BY created_ms, kid LIMIT 1", (sd,)
        ).fetchone()
        if row is not None:
            return row[0], bytes(row[1])
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT kid, key FROM erasure_keys WHERE subject_digest = ? ORDER BY created_ms, kid LIMIT 1", (sd,)
            ).fetchone()
            if row is None:
                row = (os.urandom(16).hex(), os.urandom(32))
                conn.execute(
                    "INSERT INTO erasure_keys (kid, subject_digest, key, created_ms) VALUES (?, ?, ?, ?)",
                    (row[0], sd, row[1], now_ms),
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return row[0], bytes(row[1])

    return await store.run(run)  # type: ignore[no-any-return]


def seal(kid: str, key: bytes, effect_id: str, request_digest: str, canonical: str) -> str:
    """The sealed form of a canonical request body (JSON text, as an intent's ``request``)."""
    nonce = os.urandom(12)
    ct = _aesgcm(key).encrypt(nonce, canonical.encode(), _aad(effect_id, request_digest))
    envelope = {
        SEALED: {
            "alg": ALG,
            "ct": base64.b64encode(ct).decode(),
            "kid": kid,
            "nonce": base64.b64encode(nonce).decode(),
        }
    }
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"))


def is_sealed(request: str) -> bool:
    return request.startswith(SEALED_PREFIX)


def _envelope(request: str) -> dict[str, str]:
    try:
        env = json.loads(request)[SEALED]
        if env.get("alg") != ALG or not all(isinstance(env.get(k), str) for k in ("ct", "kid", "nonce")):
            raise ValueError(f"not a {ALG} envelope")
        return env  # type: ignore[no-any-return]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidEffect(f"not a sealed request body: {e}") from None


def key_id(request: str) -> str:
    """The key id a sealed body names."""
    return _envelope(request)["kid"]


class Keyring(Protocol):
    """Where the keys of sealed bodies live: the ledger file (``FileKeyring``, embedded mode) or
    the compacted ``effects.keys`` topic (``keyring_kafka.KafkaKeyring``, Kafka mode)."""

    async def key_for(self, subject: str, now_ms: int) -> tuple[str, bytes]:
        """The subject's key (kid, key), created on first use."""
        ...

    async def key(self, kid: str) -> bytes | None:
        """The key named ``kid``; None once erased."""
        ...

    async def erase(self, subject: str) -> int:
        """Delete every key of ``subject``; how many."""
        ...

    async def close(self) -> None: ...


class FileKeyring:
    """The keys in the ledger file's ``erasure_keys`` table."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def key_for(self, subject: str, now_ms: int) -> tuple[str, bytes]:
        return await key_for(self.store, subject, now_ms)

    async def key(self, kid: str) -> bytes | None:
        rows = await self.store.query("SELECT key FROM erasure_keys WHERE kid = ?", (kid,))
        return bytes(rows[0]["key"]) if rows else None

    async def erase(self, subject: str) -> int:
        return await erase(self.store, subject)

    async def close(self) -> None:
        return None


async def open_body(keyring: Keyring, effect_id: str, request: str, request_digest: str) -> Any:
    """The request a sealed body holds (decoded JSON). ``BodyErased`` when its key was erased;
    a body that was not sealed is returned decoded as it is."""
    if not is_sealed(request):
        return json.loads(request)
    env = _envelope(request)
    key = await keyring.key(env["kid"])
    if key is None:
        raise BodyErased(f"the request body of {effect_id} was erased (its key {env['kid']} is gone)")
    from cryptography.exceptions import InvalidTag

    try:
        plain = _aesgcm(key).decrypt(
            base64.b64decode(env["nonce"]), base64.b64decode(env["ct"]), _aad(effect_id, request_digest)
        )
    except InvalidTag:
        raise InvalidEffect(
            f"the sealed request body of {effect_id} does not open: not sealed for this effect"
        ) from None
    if hashlib.sha256(plain).hexdigest() != request_digest:
        raise InvalidEffect(f"the sealed request body of {effect_id} does not match its request digest")
    return json.loads(plain)


async def erase(store: Store, subject: str) -> int:
    """Delete every key of ``subject``; returns how many. The bodies sealed under them can no
    longer be read anywhere. Idempotent: erasing a subject with no key returns 0."""
    if not isinstance(subject, str) or not subject:
        raise InvalidEffect("give the subject to erase, as a non-empty string")
    sd = subject_digest(subject)

    # The key's bytes are overwritten, not left in a free page, and leave the WAL (Store.purge).
    n = await store.purge(
        lambda conn: conn.execute("DELETE FROM erasure_keys WHERE subject_digest = ?", (sd,)).rowcount
    )
    return int(n)


__all__ = [
    "SEALED", "Keyring", "FileKeyring", "seal", "is_sealed", "key_for", "open_body", "erase",
    "subject_digest", "key_id",
]  # fmt: skip
