"""Group a stream of tuples by their first field (a key) in bounded memory.

The audit folds every effect of a window, and a window can hold more effects than fit in memory.
``KeyedSpill`` takes the tuples as they are replayed, in any order, and hands them back grouped by
key, each group whole, one after the other:

* Tuples go to one of ``FANOUT`` buckets by the key's hash: a key's tuples all land in one bucket.
* Up to ``memory_items`` tuples stay in memory. Past that the buckets spill: each is written to its
  own file in a private temporary folder, ``CHUNK`` tuples at a time (``marshal``: the tuples hold
  only str, int, bool and None). The folder and its files are removed by ``close``.
* ``groups()`` reads one bucket at a time and groups it in a dict. A bucket that holds more than
  ``memory_items`` tuples (a window of more than ``FANOUT * memory_items``) is split again into
  ``FANOUT`` buckets by further digits of the same hash, before it is read.

So the memory is about ``memory_items`` tuples however many there are, and the disk holds every
tuple once (twice while a bucket is split). Keys should be interned (``sys.intern``): the tuples of
one key then share one string, in memory and in a chunk on disk.
"""

from __future__ import annotations

import marshal
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

FANOUT = 64
CHUNK = 4096  # tuples per write to a bucket's file
MAX_DEPTH = 6  # re-splits; 64**6 buckets is beyond any window (hash digits run out at about 10)
_LEN = struct.Struct("<I")  # each chunk on disk: its length, then marshal.dumps of the list

Item = tuple[Any, ...]


class KeyedSpill:
    """Tuples grouped by ``item[0]``, in at most about ``memory_items`` tuples of memory (see the
    module docstring). ``spill_dir``: where the temporary folder goes [the system's, e.g. TMPDIR]."""

    def __init__(self, memory_items: int, spill_dir: str | None = None, *, _depth: int = 0) -> None:
        if memory_items < 1:
            raise ValueError("memory_items must be at least 1")
        self.memory_items = memory_items
        self._spill_dir = spill_dir
        self._depth = _depth
        self._div = FANOUT**_depth  # which digits of the hash pick the bucket at this depth
        self._lists: list[list[Item]] = [[] for _ in range(FANOUT)]
        self._on_disk = [0] * FANOUT  # tuples of each bucket in its file
        self._buffered = 0
        self._dir: Path | None = None
        self._files: list[BinaryIO | None] = [None] * FANOUT

    @property
    def spilling(self) -> bool:
        return self._dir is not None

    @property
    def items(self) -> int:
        return sum(self._on_disk) + sum(len(lst) for lst in self._lists)

    @property
    def spilled_items(self) -> int:
        """Tuples written to disk (at this depth)."""
        return sum(self._on_disk)

    def _count(self, b: int) -> int:
        return self._on_disk[b] + len(self._lists[b])

    def add(self, item: Item) -> None:
        # The hot path of a replay: a few operations per tuple, no counters beyond the buffer's.
        b = (hash(item[0]) // self._div) % FANOUT
        lst = self._lists[b]
        lst.append(item)
        if self._dir is not None:
            if len(lst) >= CHUNK:
                self._flush(b)
        else:
            self._buffered += 1
            if self._buffered > self.memory_items:
                self._start_spilling()

    def _start_spilling(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="effects-audit-", dir=self._spill_dir))
        for b in range(FANOUT):
            if self._lists[b]:
                self._flush(b)

    def _flush(self, b: int) -> None:
        assert self._dir is not None
        f = self._files[b]
        if f is None:
            f = self._files[b] = open(self._dir / f"{b:02d}", "wb", buffering=1 << 16)  # noqa: SIM115
        lst = self._lists[b]
        # dumps + one write: marshal.load on a file reads object by object, several times slower.
        blob = marshal.dumps(lst)
        f.write(_LEN.pack(len(blob)))
        f.write(blob)
        self._on_disk[b] += len(lst)
        lst.clear()

    def _bucket(self, b: int) -> Iterator[list[Item]]:
        """The bucket's tuples, chunk by chunk (the file's, then what is still in memory); the file
        is removed once read."""
        f = self._files[b]
        if f is not None:
            self._files[b] = None
            f.close()
            path = Path(f.name)
            with open(path, "rb") as r:
                while head := r.read(_LEN.size):
                    (n,) = _LEN.unpack(head)
                    yield marshal.loads(r.read(n))
            path.unlink()
        lst = self._lists[b]
        self._lists[b] = []
        yield lst

    def groups(self) -> Iterator[tuple[Any, list[Item]]]:
        """Every key with all its tuples (in the order added), bucket by bucket; consumes the spill."""
        try:
            for b in range(FANOUT):
                n = self._count(b)
                if not n:
                    continue
                if n > self.memory_items and self._depth < MAX_DEPTH:
                    sub = KeyedSpill(self.memory_items, str(self._dir), _depth=self._depth + 1)
                    try:
                        for chunk in self._bucket(b):
                            for item in chunk:
                                sub.add(item)
                        yield from sub.groups()
                    finally:
                        sub.close()
                    continue
                by_key: dict[Any, list[Item]] = {}
                for chunk in self._bucket(b):
                    for item in chunk:
                        g = by_key.get(item[0])
                        if g is None:
                            by_key[item[0]] = [item]
                        else:
                            g.append(item)
                yield from by_key.items()
                del by_key
        finally:
            self.close()

    def close(self) -> None:
        """Remove the temporary folder and its files (idempotent)."""
        for i, f in enumerate(self._files):
            if f is not None:
                f.close()
                self._files[i] = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __del__(self) -> None:
        if getattr(self, "_dir", None) is not None and os is not None:
            self.close()
