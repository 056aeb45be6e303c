"""What ``execute`` hands back, and how a call's return value becomes a recorded receipt."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from effect_ledger.core.effect import Effect
from effect_ledger.core.limits import MAX_RECEIPT_ID_BYTES, check_text, digest_id, error_text, receipt_text
from effect_ledger.core.model import INEXACT_PREFIX, ReceiptSource
from effect_ledger.core.reconcile import Target


def wall_clock_ms() -> int:
    """The default clock of a ledger: epoch milliseconds."""
    return time.time_ns() // 1_000_000


class _RandomHex(threading.local):
    """80-bit random suffixes for event ids, 20 hex characters each, cut from one ``os.urandom``
    read per ``_IDS_PER_READ`` ids. ``os.urandom`` releases the GIL: once per id, every event an SDK
    wrote handed the interpreter to whichever thread was waiting for it (the store's, under
    concurrent tasks), and the event loop waited to get it back. The bytes are the same kernel
    randomness. Each thread cuts from its own bytes (a thread-local: no two threads can take the
    same slice), and a forked child drops what its parent had not used, so no two processes share
    a suffix either."""

    _IDS_PER_READ = 256

    def __init__(self) -> None:
        self.hex = ""
        self.at = 0

    def take(self) -> str:
        at = self.at
        if at >= len(self.hex):
            self.hex, at = os.urandom(10 * self._IDS_PER_READ).hex(), 0
        self.at = at + 20
        return self.hex[at : at + 20]


_random = _RandomHex()
_random_hex = _random.take


def _forget_in_child() -> None:
    """After a fork, in the child: the forking thread's unread bytes are its parent's too."""
    _random.hex, _random.at = "", 0


os.register_at_fork(after_in_child=_forget_in_child)


def new_event_id() -> str:
    """32 hex characters, time-ordered (48-bit ms, then 80 random bits): unique like a uuid4, and
    kind to the event_id index, where random keys would scatter every insert."""
    return f"{time.time_ns() // 1_000_000:012x}{_random_hex()}"


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What ``execute`` returns: the destination's receipt for the effect."""

    effect_id: str
    receipt_id: str
    value: Any  # what the destination returned (decoded JSON)
    source: ReceiptSource
    attempt: int
    called: bool  # True when this call executed it; False when it was already recorded
    # False when the recorded value is a representation (``{"effect_ledger.inexact": ...}``): the
    # destination returned something that is not JSON, or too large (see ``limits.receipt_text``).
    exact: bool = True


def confirmation_of(effect: Effect, called: bool) -> Confirmation:
    """The confirmation of a CONFIRMED effect, from its recorded receipt."""
    r = effect.receipt
    assert r is not None
    exact = not r.value.startswith(INEXACT_PREFIX)
    return Confirmation(effect.effect_id, r.receipt_id, json.loads(r.value), r.source, r.attempt, called, exact)


def receipt_of(target: Target, value: Any) -> tuple[str, str, str | None]:
    """(receipt id, recorded JSON text, what could not be recorded exactly or None) for what a call
    returned. Never raises: the call already happened, so its record must not depend on its value.
    The id is the target's ``receipt_id(value)``, else the value's ``"id"``, else (and whenever
    those fail or give no usable id) the digest of the recorded text."""
    text, problem = receipt_text(value)
    try:
        if target.receipt_id is not None:
            rid: Any = target.receipt_id(value)
        elif isinstance(value, dict) and value.get("id") is not None:
            rid = value["id"]
        else:
            return digest_id(text), text, problem
        rid = check_text("receipt id", str(rid), MAX_RECEIPT_ID_BYTES)
    except Exception as e:  # the target's function, a str() or a lookup that raises
        why = f"receipt id not found ({error_text(e)}); using the value's digest"
        return digest_id(text), text, f"{problem}; {why}" if problem else why
    return rid, text, problem


__all__ = ["Confirmation", "confirmation_of", "new_event_id", "receipt_of", "wall_clock_ms"]
