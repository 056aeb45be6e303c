"""Issue 10, item 1: the HTTP reconciler followed redirects and believed the answer. A lookup URL
that redirects to another host answering 404 was recorded ABSENT (the next execute paid again), and
the configured headers (an API key) went to the other host. Real HTTP servers on loopback: the
lookup endpoint redirects to a second origin that answers 404 to everything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.reconcile import EffectView, Target, Unknown
from effect_ledger.demo.client import GatewayClient, GatewayUnavailable
from effect_ledger.demo.gateway import Gateway
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.targets.http import HttpReconciler
from tests.faults.http_servers import LoopbackServer, Reply
from tests.sdk_contract import FakeClock, run

T0 = 1_700_000_000_000
SECRET = "sk_live_not_for_other_hosts"


@pytest.fixture
def elsewhere() -> Iterator[LoopbackServer]:
    """Another origin: knows nothing, answers 404 to everything."""
    with LoopbackServer(lambda path: Reply(404, b'{"error": "no such refund"}')) as srv:
        yield srv


@pytest.fixture
def redirector(elsewhere: LoopbackServer) -> Iterator[LoopbackServer]:
    """The configured lookup endpoint: answers every request with a redirect to ``elsewhere``."""
    with LoopbackServer(lambda path: Reply(302, b"", {"Location": f"{elsewhere.url}{path}"})) as srv:
        yield srv


def view(key: str) -> EffectView:
    return EffectView(key, "payments", "refund.create", {"order": "123", "amount": 4800}, 1, T0, T0 + 10_000)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirect_to_another_origin_is_unknown_and_never_absent(status: int, elsewhere: LoopbackServer) -> None:
    with LoopbackServer(lambda path: Reply(status, b"", {"Location": f"{elsewhere.url}{path}"})) as lookup:
        r = HttpReconciler(f"{lookup.url}/refunds/by-key/{{key}}", headers={"X-Api-Key": SECRET}, timeout=5)
        answer = run(r.check(view("k-1")))
    assert isinstance(answer, Unknown), f"a redirect to another origin was believed: {answer!r}"
    assert str(status) in answer.reason and elsewhere.url in answer.reason  # says what happened
    assert elsewhere.seen == []  # never followed


def test_api_key_header_never_reaches_another_origin(redirector: LoopbackServer, elsewhere: LoopbackServer) -> None:
    r = HttpReconciler(f"{redirector.url}/refunds/by-key/{{key}}", headers={"X-Api-Key": SECRET}, timeout=5)
    run(r.check(view("k-1")))
    assert [s.headers.get("x-api-key") for s in redirector.seen] == [SECRET]  # the destination got it
    leaked = [s for s in elsewhere.seen if SECRET in s.headers.values()]
    assert leaked == [], f"the API key was sent to {elsewhere.url}: {leaked}"


def test_redirected_lookup_after_a_lost_reply_never_pays_twice(
    tmp_path: Path, redirector: LoopbackServer, elsewhere: LoopbackServer
) -> None:
    """End to end: the gateway (lookup-only: it does not deduplicate keys) commits the refund and the
    reply is lost; its lookup endpoint redirects to a host that answers 404. The next execute must
    hold (EffectUncertain), not pay again."""
    clock = FakeClock()
    with Gateway("lookup") as gw:
        target = Target(
            "payments",
            reconciler=HttpReconciler(
                f"{redirector.url}/refunds/by-key/{{key}}", headers={"X-Api-Key": SECRET}, timeout=5
            ),
        )

        async def body() -> None:
            ledger = await Ledger.open(str(tmp_path / "effects.db"), clock=clock, targets=[target])
            try:
                async with GatewayClient(gw.url) as client:

                    def execute() -> Any:
                        return ledger.execute(
                            target="payments", operation="refund.create", run_id="run-1", step="refund-123",
                            request={"order": "123", "amount": 4800},
                            call=lambda key: client.refund("123", 4800, idempotency_key=key), timeout=10,
                        )  # fmt: skip

                    gw.state.failures.append(("lost", 0.0))
                    with pytest.raises(EffectUncertain) as first:
                        await execute()
                    assert isinstance(first.value.__cause__, GatewayUnavailable)
                    clock.advance(10_001)  # past the attempt's deadline: a proven "absent" would re-execute
                    try:
                        await execute()
                    except EffectUncertain as e:
                        assert "redirect" in e.reason
            finally:
                await ledger.close()

        run(body())
        charges = [(r.id, r.idempotency_key) for r in gw.refunds()]
    assert len(charges) == 1, f"charged {len(charges)} times: {charges}"
    assert not any(SECRET in s.headers.values() for s in elsewhere.seen)
