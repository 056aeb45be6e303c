"""Issue 10, item 11: the HTTP reconciler read any answer whole (a 300 MB body took the process from
36 to 636 MB). The body is read up to a documented bound; a longer one is an Unknown, and the reader
stops: the server, which generates the body on the fly, manages to send only a small part of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from effect_ledger.core.reconcile import EffectView, Unknown
from effect_ledger.targets.http import HttpReconciler
from tests.faults.http_servers import LoopbackServer, Reply
from tests.sdk_contract import run
from tests.services import wait_for

T0 = 1_700_000_000_000
TOTAL = 128 << 20  # what the server would send if nobody stopped reading
CHUNK = 64 << 10
# The bound plus what the kernel's socket buffers on both sides of a loopback connection can hold.
STOPPED_EARLY = 32 << 20


def huge_json() -> Iterator[bytes]:
    """A JSON object whose string field never ends within TOTAL bytes, made as it is sent."""
    yield b'{"id": "re_1", "pad": "'
    pad = b"x" * CHUNK
    for _ in range(TOTAL // CHUNK):
        yield pad


def view() -> EffectView:
    return EffectView("k-1", "payments", "refund.create", {}, 1, T0, T0 + 10_000)


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "content-length"])
def test_huge_answer_is_unknown_and_read_only_up_to_the_bound(declared: bool) -> None:
    headers = {"Content-Type": "application/json"}
    if declared:
        headers["Content-Length"] = str(TOTAL + 23)

    def answer(path: str) -> Reply:
        return Reply(200, huge_json(), headers)

    with LoopbackServer(answer) as srv:
        result = run(HttpReconciler(f"{srv.url}/refunds/by-key/{{key}}", timeout=60).check(view()))
        wait_for(lambda: srv.streams_done == 1, 60, "the server to stop streaming")
        sent = srv.streamed
    assert sent < STOPPED_EARLY, f"the reconciler read {sent} bytes of a {TOTAL}-byte answer ({result!r})"
    assert isinstance(result, Unknown) and "over" in result.reason and "bytes" in result.reason, result
