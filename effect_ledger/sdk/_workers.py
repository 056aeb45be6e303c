"""Who holds a claim, and whether it still lives.

A claim on a key names its owner as ``host:pid:start:nonce`` (``worker_identity``). Whether that
owner may still be executing the key (``owner_alive``) is read from the process table of this host
and from the ledger objects of this process (``LocalWorker``); an owner on another host is judged by
its lease alone (the attempt's deadline). The per-call plan (``effect_ledger.core.plan``) takes
the answer as an input, so the decision itself stays pure.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
import weakref


def _this_host() -> str:
    return socket.gethostname()


def _process_start(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot, to tell a live pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def worker_identity() -> str:
    """``host:pid:start:nonce``: enough to tell, on the same host, whether the worker still lives
    (the nonce tells two ledgers of one process apart)."""
    pid = os.getpid()
    return f"{_this_host()}:{pid}:{_process_start(pid) or '0'}:{uuid.uuid4().hex[:8]}"


class LocalWorker:
    """One ledger object of this process as claims see it: the identity it writes as a claim's
    owner, and the keys it is executing right now. Registered weakly, so a ledger object that is
    gone (closed, or dropped mid-call) stops vouching for its claims."""

    __slots__ = ("identity", "in_flight", "open", "_entering", "__weakref__")

    def __init__(self) -> None:
        self.identity = worker_identity()
        self.in_flight: set[str] = set()
        self.open = True
        # A ledger object is used from several threads at once (``SyncLedger`` runs each caller's
        # operations on the caller's thread): taking a key is one step for all of them.
        self._entering = threading.Lock()
        _LOCAL_WORKERS[self.identity] = self

    def enter(self, key: str) -> bool:
        """Mark ``key`` in flight; False when it already is (another task or thread executes it)."""
        with self._entering:
            if key in self.in_flight:
                return False
            self.in_flight.add(key)
            return True

    def leave(self, key: str) -> None:
        self.in_flight.discard(key)


_LOCAL_WORKERS: weakref.WeakValueDictionary[str, LocalWorker] = weakref.WeakValueDictionary()


def owner_alive(owner: str, key: str | None = None) -> bool | None:
    """Whether the claim's owner can still be executing ``key``: True/False for an owner in another
    process of this host (its pid and start time); None when nobody can tell, so only its lease
    (the attempt's deadline) does — an owner on another host, or one of this process that is not
    an open ledger object with ``key`` in flight (its call cannot be running, but its lease is
    kept: the object may have been dropped while its call was still on the wire)."""
    try:
        host, pid_s, start, _nonce = owner.rsplit(":", 3)
        pid = int(pid_s)
    except ValueError:
        return None
    if host != _this_host():
        return None
    if pid == os.getpid() and start == (_process_start(pid) or "0"):
        # This process: the pid says nothing, a ledger object's identity does.
        local = _LOCAL_WORKERS.get(owner)
        if local is not None and local.open and (key is None or key in local.in_flight):
            return True
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _process_start(pid) == start


__all__ = ["LocalWorker", "owner_alive", "worker_identity"]
