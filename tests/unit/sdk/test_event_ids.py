"""Event ids (``receipts.new_event_id``): unique across threads and forked processes, time-ordered,
and cut from a buffer of kernel randomness rather than one ``os.urandom`` call each (which
releases the GIL: under concurrent tasks, every event handed the interpreter to the store's
thread and the event loop waited to get it back)."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from effect_ledger.sdk import receipts
from effect_ledger.sdk.receipts import new_event_id

ID = re.compile(r"^[0-9a-f]{32}$")


def test_ids_are_32_hex_characters_with_the_time_first() -> None:
    before = time.time_ns() // 1_000_000
    event_id = new_event_id()
    after = time.time_ns() // 1_000_000
    assert ID.fullmatch(event_id)
    assert before <= int(event_id[:12], 16) <= after


def test_ids_of_many_threads_never_collide() -> None:
    ids: list[list[str]] = [[] for _ in range(4)]

    def take(out: list[str]) -> None:
        for _ in range(20_000):
            out.append(new_event_id())

    threads = [threading.Thread(target=take, args=(out,)) for out in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in ids for i in out]
    assert len(every) == 80_000
    assert len(set(every)) == len(every)


def test_randomness_is_read_once_per_many_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = os.urandom

    def counting(n: int) -> bytes:
        reads.append(n)
        return real(n)

    monkeypatch.setattr(receipts.os, "urandom", counting)
    ids = {new_event_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert len(reads) <= 10_000 // 256 + 1, f"{len(reads)} reads of os.urandom for 10,000 ids"


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_event_id()  # the parent holds unread random bytes at the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(w, "".join(new_event_id()[12:] for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        text = f.read()
    child = {text[i : i + 20] for i in range(0, len(text), 20)}
    parent = {new_event_id()[12:] for _ in range(50)}
    assert len(child) == 50
    assert not child & parent
