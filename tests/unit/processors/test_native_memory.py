"""processors/native_memory.py: free memory in the middle of the allocator's heap goes back."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

import pytest

from effect_ledger.processors import native_memory

glibc = platform.libc_ver()[0] == "glibc"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not glibc, reason="malloc_trim is glibc's")
def test_free_pages_held_below_a_live_block_go_back_to_the_system() -> None:
    """What a worker's heap looks like after a compaction: many freed blocks under one still in
    use at the top, which glibc's own trimming (only from the top) cannot give back."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    size, n = 16 << 10, 4096  # 64 MB in blocks below glibc's mmap threshold: from the heap
    blocks = [libc.malloc(size) for _ in range(n)]
    for b in blocks:
        libc.memset(b, 1, size)  # resident
    top = blocks.pop()
    for b in blocks:
        libc.free(b)
    try:
        held = _rss_bytes()
        assert native_memory.available()
        assert native_memory.release_free_memory() is True
        assert held - _rss_bytes() > 32 << 20
    finally:
        libc.free(top)


def test_without_malloc_trim_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_memory, "_malloc_trim", lambda: None)
    assert native_memory.available() is False
    assert native_memory.release_free_memory() is False
