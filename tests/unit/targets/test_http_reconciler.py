"""``effect_ledger.targets.http.HttpReconciler`` against the real fake gateway over loopback HTTP: status
codes and JSON mapped to Found / Absent / Unknown, transport failures as Unknown, the URL template and
key quoting; then the reconciler inside the ledger after a lost reply. No broker needed."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import ReceiptSource, State
from effect_ledger.core.reconcile import Absent, EffectView, Found, Target, Unknown
from effect_ledger.demo.client import GatewayClient, GatewayUnavailable, RefundRejected
from effect_ledger.demo.gateway import KINDS, Gateway
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.targets.http import HttpReconciler
from tests.sdk_contract import FakeClock, run

T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def gateways() -> Iterator[dict[str, Gateway]]:
    running = {kind: Gateway(kind).start() for kind in KINDS}
    yield running
    for gw in running.values():
        gw.stop()


@pytest.fixture
def gw(gateways: dict[str, Gateway]) -> Iterator[dict[str, Gateway]]:
    for g in gateways.values():
        g.state.reset()
    yield gateways


def view(key: str, target: str = "payments", operation: str = "refund.create") -> EffectView:
    return EffectView(key, target, operation, {"order": "123", "amount": 4800}, 1, T0, T0 + 10_000)


def lookup(g: Gateway, **kw: Any) -> HttpReconciler:
    return HttpReconciler(f"{g.url}/refunds/by-key/{{key}}", name="gateway-lookup", timeout=5.0, **kw)


async def refund(g: Gateway, key: str | None) -> dict[str, Any]:
    async with GatewayClient(g.url) as client:
        return await client.refund("123", 4800, idempotency_key=key)


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


# --- against the gateway --------------------------------------------------------------------------------


def test_found_gives_the_refund_id_and_body(gw: dict[str, Gateway]) -> None:
    g = gw["key+lookup"]
    key = effect_key("payments", "refund.create", "run-1", "refund-123")  # contains ':'
    made = run(refund(g, key))
    answer = run(lookup(g).check(view(key)))
    assert answer == Found(made["id"], made)
    assert answer.receipt_id == "re_0001"  # type: ignore[union-attr]


def test_found_at_a_lookup_only_gateway(gw: dict[str, Gateway]) -> None:
    g = gw["lookup"]
    made = run(refund(g, "k-1"))
    assert run(lookup(g).check(view("k-1"))) == Found(made["id"], made)


def test_absent_is_404(gw: dict[str, Gateway]) -> None:
    g = gw["key+lookup"]
    run(refund(g, "another-key"))
    answer = run(lookup(g).check(view("never-sent")))
    assert isinstance(answer, Absent) and "404" in answer.reason


@pytest.mark.parametrize("kind", ["key", "none"])
def test_lookup_unsupported_is_unknown(gw: dict[str, Gateway], kind: str) -> None:
    g = gw[kind]
    run(refund(g, "k-1"))
    answer = run(lookup(g).check(view("k-1")))
    assert isinstance(answer, Unknown) and "501" in answer.reason


def test_connection_refused_is_unknown() -> None:
    port = closed_port()
    r = HttpReconciler(f"http://127.0.0.1:{port}/refunds/by-key/{{key}}", timeout=5.0)
    answer = run(r.check(view("k-1")))
    assert isinstance(answer, Unknown)
    assert f"127.0.0.1:{port}" in answer.reason


def test_no_reply_within_the_timeout_is_unknown() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # the handshake completes in the kernel; nobody ever answers
    try:
        port = server.getsockname()[1]
        r = HttpReconciler(f"http://127.0.0.1:{port}/x/{{key}}", timeout=0.3)
        answer = run(r.check(view("k-1")))
        assert isinstance(answer, Unknown) and "Timeout" in answer.reason
    finally:
        server.close()


# --- the mapping, without I/O ----------------------------------------------------------------------------


def test_interpret_default_mapping() -> None:
    r = HttpReconciler("http://gw/{key}")
    assert r.interpret(200, '{"id": "re_1", "amount": 5}') == Found("re_1", {"id": "re_1", "amount": 5})
    assert r.interpret(200, '{"id": 17}') == Found("17", {"id": 17})
    assert isinstance(r.interpret(404, "nope"), Absent)
    assert isinstance(r.interpret(410, ""), Absent)
    for status in (201, 400, 409, 429, 500, 501, 503):
        answer = r.interpret(status, '{"id": "re_1"}')
        assert isinstance(answer, Unknown) and str(status) in answer.reason
    assert isinstance(r.interpret(200, "<html>oops</html>"), Unknown)
    assert isinstance(r.interpret(200, '{"refund": "re_1"}'), Unknown)  # no receipt field
    assert isinstance(r.interpret(200, '["re_1"]'), Unknown)
    assert isinstance(r.interpret(200, '{"id": null}'), Unknown)


def test_interpret_custom_statuses_and_receipt_field() -> None:
    r = HttpReconciler("http://gw/{key}", found_status=(200, 201), absent_status=(204,), receipt_field="data.refund.id")
    body = {"data": {"refund": {"id": "re_9"}}}
    assert r.interpret(201, json.dumps(body)) == Found("re_9", body)
    assert isinstance(r.interpret(204, ""), Absent)
    assert isinstance(r.interpret(404, ""), Unknown)  # 404 is not "absent" for this destination
    assert isinstance(r.interpret(200, '{"data": {"refund": "re_9"}}'), Unknown)


def test_interpret_state_field_values() -> None:
    r = HttpReconciler(
        "http://gw/{key}",
        state_field="status",
        absent_values=("failed", "canceled"),
        pending_values=("pending", "requires_action"),
    )
    ok = {"id": "re_1", "status": "succeeded"}
    assert r.interpret(200, json.dumps(ok)) == Found("re_1", ok)
    for value in ("failed", "canceled"):
        answer = r.interpret(200, json.dumps({"id": "re_1", "status": value}))
        assert isinstance(answer, Absent) and value in answer.reason
    for value in ("pending", "requires_action"):
        answer = r.interpret(200, json.dumps({"id": "re_1", "status": value}))
        assert isinstance(answer, Unknown) and value in answer.reason
    # The state field only refines a found-status reply.
    assert isinstance(r.interpret(404, json.dumps({"status": "succeeded"})), Absent)
    assert isinstance(r.interpret(503, json.dumps({"id": "re_1", "status": "succeeded"})), Unknown)


def test_template_without_key_is_refused() -> None:
    with pytest.raises(ValueError, match="key"):
        HttpReconciler("http://gw/refunds/{target}")
    with pytest.raises(ValueError):
        HttpReconciler("http://gw/refunds?key=")


def test_url_template_quotes_the_key() -> None:
    r = HttpReconciler("http://gw/{target}/{operation}/by-key/{key}?x=1")
    assert r.url_for(view("payments:ab/c?d#e%f+g&h=i")) == (
        "http://gw/payments/refund.create/by-key/payments%3Aab%2Fc%3Fd%23e%25f%2Bg%26h%3Di?x=1"
    )
    # Dots too: a key made of dots must never become a "." or ".." path step.
    assert r.url_for(view("plain-key_1.2~3")) == "http://gw/payments/refund.create/by-key/plain-key_1%2E2~3?x=1"
    assert r.url_for(view("..")) == "http://gw/payments/refund.create/by-key/%2E%2E?x=1"


def test_template_with_the_key_in_the_host_is_refused() -> None:
    """The origin is where the headers go and whose answer counts: the key may not choose it."""
    for url in ("http://{key}/refunds", "http://gw.{key}.example/x", "/relative/{key}", "http://gw/{key}/{nope}"):
        with pytest.raises(ValueError):
            HttpReconciler(url)
    HttpReconciler("http://{target}.gw.example/by-key/{key}")  # the target is declared, not chosen by a caller


def test_bad_redirect_and_body_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="redirects"):
        HttpReconciler("http://gw/{key}", redirects="all")  # type: ignore[arg-type]
    for size in (0, -1, 16 * 2**20 + 1, True, 1.5):
        with pytest.raises(ValueError, match="max_body"):
            HttpReconciler("http://gw/{key}", max_body=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["order/123", "50%off", "k?x=1#frag"])
def test_keys_that_need_quoting_round_trip_through_the_gateway(gw: dict[str, Gateway], key: str) -> None:
    """Any printable-ASCII key is a valid effect key. The refund made with it must be found by it,
    or a lookup-only destination would be asked again: a second refund."""
    g = gw["key+lookup"]
    made = run(refund(g, key))
    assert made["idempotency_key"] == key
    assert run(lookup(g).check(view(key))) == Found(made["id"], made)


def test_headers_are_sent(gw: dict[str, Gateway]) -> None:
    # The gateway ignores headers; at least a reconciler with headers works against it.
    g = gw["key+lookup"]
    made = run(refund(g, "k-h"))
    r = lookup(g, headers={"Authorization": "Bearer test"})
    assert run(r.check(view("k-h"))) == Found(made["id"], made)


# --- redirects and body size, over loopback -----------------------------------------------------------------


def test_same_origin_redirect_is_followed_when_allowed_but_its_answer_is_no_evidence(tmp_path: Path) -> None:
    """redirects = "same-origin" follows the redirect (headers kept on the origin) so the reason can
    say what the final page answered; that page is not the one the lookup names, so its answer is
    Unknown: never a receipt (issue 34, effect_ledger.targets.evidence)."""
    from tests.faults.http_servers import LoopbackServer, Reply

    def answer(path: str) -> Reply:
        if path.startswith("/old/"):
            return Reply(308, b"", {"Location": "/new/" + path[len("/old/") :]})
        return Reply(200, json.dumps({"id": "re_7", "path": path}).encode())

    with LoopbackServer(answer) as srv:
        url = f"{srv.url}/old/{{key}}"
        assert isinstance(run(HttpReconciler(url, headers={"X-Api-Key": "k"}).check(view("a.b"))), Unknown)
        r = HttpReconciler(url, headers={"X-Api-Key": "k"}, redirects="same-origin")
        followed = run(r.check(view("a.b")))
        assert isinstance(followed, Unknown) and "redirect" in followed.reason and "re_7" in followed.reason
        assert [s.headers.get("x-api-key") for s in srv.seen[-2:]] == ["k", "k"]


def test_endless_same_origin_redirects_are_unknown() -> None:
    from tests.faults.http_servers import LoopbackServer, Reply

    with LoopbackServer(lambda path: Reply(302, b"", {"Location": path + "x"})) as srv:
        answer = run(HttpReconciler(f"{srv.url}/{{key}}", redirects="same-origin").check(view("k")))
        assert isinstance(answer, Unknown) and "more than 5 redirects" in answer.reason
        assert len(srv.seen) == 6


def test_answer_up_to_max_body_is_read_and_one_byte_more_is_unknown() -> None:
    from tests.faults.http_servers import LoopbackServer, Reply

    body = json.dumps({"id": "re_1", "pad": "x" * 1000}).encode()
    with LoopbackServer(lambda path: Reply(200, iter([body[:10], body[10:]]))) as srv:
        assert run(HttpReconciler(f"{srv.url}/{{key}}", max_body=len(body)).check(view("k"))) == Found(
            "re_1", json.loads(body)
        )
        answer = run(HttpReconciler(f"{srv.url}/{{key}}", max_body=len(body) - 1).check(view("k")))
        assert isinstance(answer, Unknown) and f"over {len(body) - 1} bytes" in answer.reason


def test_targets_file_sets_redirects_and_max_body(tmp_path: Path) -> None:
    from effect_ledger.errors import TargetsError
    from effect_ledger.targets.load import parse_targets

    (t,) = parse_targets(
        '[targets.payments]\nlookup = "http://gw/by-key/{key}"\nredirects = "same-origin"\nmax_body = 4096\n'
    )
    assert isinstance(t.reconciler, HttpReconciler)
    assert (t.reconciler.redirects, t.reconciler.max_body) == ("same-origin", 4096)
    (d,) = parse_targets('[targets.payments]\nlookup = "http://gw/by-key/{key}"\n')
    assert isinstance(d.reconciler, HttpReconciler)
    assert (d.reconciler.redirects, d.reconciler.max_body) == ("none", 256 * 1024)
    for bad in ('redirects = "all"', "max_body = 0", 'max_body = "1MB"', "max_body = 99999999999"):
        with pytest.raises(TargetsError, match=":3: "):  # the line of the bad setting
            parse_targets(f'[targets.payments]\nlookup = "http://gw/by-key/{{key}}"\n{bad}\n')


# --- inside the ledger -------------------------------------------------------------------------------------


def payments(g: Gateway) -> Target:
    kind = g.state.kind
    return Target(
        "payments",
        reconciler=lookup(g) if kind in ("key+lookup", "lookup") else None,
        honours_keys=kind in ("key+lookup", "key"),
        definite_errors=(RefundRejected,),
    )


@pytest.mark.parametrize(
    "kind,key",
    [*((k, None) for k in KINDS), ("lookup", "order/123")],
    ids=[*KINDS, "lookup-caller-key-with-slash"],
)
def test_lost_reply_then_execute_again_never_pays_twice(
    tmp_path: Path, gw: dict[str, Gateway], kind: str, key: str | None
) -> None:
    """The gateway commits the refund and the reply is lost; the agent asks again. The ledger must
    find the refund (lookup), or replay the key (dedupe), or escalate (neither): never pay twice.
    The last case uses a caller-supplied key (any printable ASCII is allowed) that needs quoting in
    the lookup URL."""
    g = gw[kind]
    clock = FakeClock()

    async def body() -> None:
        ledger = await Ledger.open(str(tmp_path / "effects.db"), clock=clock, targets=[payments(g)])
        try:
            async with GatewayClient(g.url) as client:

                def execute() -> Any:
                    return ledger.execute(
                        target="payments",
                        operation="refund.create",
                        run_id="run-1",
                        step="refund-123",
                        key=key,
                        request={"order": "123", "amount": 4800},
                        call=lambda key: client.refund("123", 4800, idempotency_key=key),
                        timeout=10,
                    )

                g.state.failures.append(("lost", 0.0))
                with pytest.raises(EffectUncertain) as ei:
                    await execute()
                assert isinstance(ei.value.__cause__, GatewayUnavailable)
                assert len(g.refunds()) == 1
                clock.advance(10_001)
                if kind == "none":
                    with pytest.raises(EffectUncertain) as ei:
                        await execute()
                    assert ei.value.state == State.ESCALATED.value
                else:
                    c = await execute()
                    made = [(r.id, r.idempotency_key) for r in g.refunds()]
                    assert len(made) == 1, f"paid twice: {made}"
                    assert c.receipt_id == made[0][0] and not c.called
                    assert c.source is ReceiptSource.RECONCILER
                assert len(g.refunds()) == 1
        finally:
            await ledger.close()

    run(body())
