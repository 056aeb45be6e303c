"""Least privilege on a secured broker (TLS, SCRAM, ACLs denying by default): each role does its job
with only the rights ``effects acl`` gives it, and what it may not do is one typed error naming
the missing right, never a silent loss, a retry loop, or a call to the destination.

Each test has its own topic prefix and principals (``conftest.Secured``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import BrokerRefusedLogin, Ledger, NotAuthorized, Target
from effect_ledger.core.model import DecisionKind, State
from effect_ledger.streams.config import KafkaConfig
from tests.integration.test_sdk_kafka import consume_all, unsent_rows
from tests.secure.conftest import ROOT, Secured, env_of

TARGETS = [Target("payments")]


class Destination:
    """A destination that counts the calls it receives."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def refund(self, key: str) -> dict[str, str]:
        self.calls.append(key)
        return {"id": f"re_{len(self.calls)}"}


def effects_cli(cfg: KafkaConfig, *args: str) -> subprocess.CompletedProcess[str]:
    """``effects ARGS`` with ``cfg``'s broker, prefix and credentials (through the environment)."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("KAFKA_")}
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *args], cwd=ROOT, env={**env, **env_of(cfg)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def rows(path: Path) -> list[tuple[str, int]]:
    """(kind, sent) of every row of a ledger file's outbox."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT kind, sent FROM events ORDER BY seq").fetchall()


async def refund(ledger: Ledger, dest: Destination, run: str) -> Any:
    return await ledger.execute(
        target="payments", operation="refund.create", run_id=run, step="refund", request={"order": run},
        call=dest.refund, timeout=10,
    )  # fmt: skip


def test_an_agent_records_effects_with_the_agent_role_alone(secured: Secured, tmp_path: Path) -> None:
    agent = secured.user("agent")
    dest = Destination()

    async def go() -> None:
        async with await Ledger.open(tmp_path / "a.db", kafka=agent, sync=True, targets=TARGETS) as ledger:
            c = await refund(ledger, dest, "r1")
            assert c.called and c.receipt_id == "re_1"

    asyncio.run(go())
    assert unsent_rows(str(tmp_path / "a.db")) == []
    kinds = [
        m.headers()[0][1].decode().rsplit(".", 1)[-1] for m in consume_all(secured.admin, secured.admin.topics.events)
    ]
    assert kinds == ["Intent", "Executed", "Receipt"], kinds


def test_an_agent_may_not_decide(secured: Secured, tmp_path: Path) -> None:
    agent = secured.user("agent")
    dest = Destination()
    db = tmp_path / "a.db"

    async def go() -> None:
        async with await Ledger.open(db, kafka=agent, sync=True, targets=TARGETS) as ledger:
            c = await refund(ledger, dest, "r1")
            before = [k for k, _ in rows(db)]
            with pytest.raises(NotAuthorized) as e:
                await ledger.decide(c.effect_id, DecisionKind.ABANDONED, by="mallory", reason="no")
            assert "Write on topic " + agent.topics.decisions in str(e.value)
            assert e.value.principal == f"User:{agent.sasl_username}"
            assert [k for k, _ in rows(db)] == before  # nothing recorded: no "ok" followed by a refusal in the outbox
            c2 = await refund(ledger, dest, "r2")  # and the file stays usable
            assert c2.called

    asyncio.run(go())
    assert unsent_rows(str(db)) == [] and len(dest.calls) == 2


@pytest.mark.parametrize("role", ["subscriber", "operator", "auditor", "sink", None])
def test_a_credential_that_may_not_write_events_is_refused_when_the_ledger_opens(
    secured: Secured, tmp_path: Path, role: str | None
) -> None:
    cfg = secured.user(role)
    db = tmp_path / "a.db"
    db.write_bytes(b"")  # an existing file stays as it was

    async def go() -> None:
        await Ledger.open(db, kafka=cfg, sync=False, targets=TARGETS)

    with pytest.raises(NotAuthorized) as e:
        asyncio.run(go())
    assert f"Write on topic {cfg.topics.events}" in str(e.value)
    assert db.read_bytes() == b""


def test_a_refused_row_is_set_aside_and_the_rows_behind_it_are_sent(secured: Secured, tmp_path: Path) -> None:
    """A decision recorded in a file without Kafka, relayed later by an agent's credential: the
    decision is refused by the ACLs and set aside with its reason; the events behind it go."""
    agent = secured.user("agent")
    db = tmp_path / "a.db"
    dest = Destination()

    async def record() -> None:
        async with await Ledger.open(db, targets=TARGETS) as ledger:  # embedded: no Kafka yet
            c = await refund(ledger, dest, "r1")
            await ledger.decide(c.effect_id, DecisionKind.COMPENSATED, by="alice", reason="refunded by hand")
            await refund(ledger, dest, "r2")

    asyncio.run(record())
    r = effects_cli(agent, "relay", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert "1 events Kafka refused" in r.stdout, r.stdout
    assert [k for k, sent in rows(db) if sent == 2] == ["Decision"]
    assert unsent_rows(str(db)) == []
    with sqlite3.connect(db) as conn:
        (reason,) = conn.execute("SELECT reason FROM dead_letters").fetchone()
    assert f"Write on topic {agent.topics.decisions}" in reason
    listed = effects_cli(agent, "relay", "--db", str(db), "--refused", "--wide")
    assert listed.returncode == 0 and "1 rows set aside" in listed.stdout, listed.stderr
    assert "Decision" in listed.stdout and f"Write on topic {agent.topics.decisions}" in listed.stdout
    on_kafka = consume_all(secured.admin, secured.admin.topics.events)
    assert len(on_kafka) == 6  # both effects: intent, executed and receipt each
    assert agent.sasl_password not in r.stdout + r.stderr + listed.stdout + listed.stderr
    # Set aside is not lost: once the right is given, the row goes.
    from effect_ledger.streams import rights
    from effect_ledger.streams.acl import Grant, Right

    right = Right("topic", agent.topics.decisions, "literal", "Write")
    rights.apply(secured.admin, [Grant(f"User:{agent.sasl_username}", "operator", (right,))])
    again = effects_cli(agent, "relay", "--db", str(db), "--resend-refused")
    assert again.returncode == 0 and "1 rows refused by Kafka's ACLs put back" in again.stdout, again.stderr
    assert [k for k, sent in rows(db) if sent != 1] == []
    assert len(consume_all(secured.admin, secured.admin.topics.decisions)) == 1


def test_a_relay_with_another_roles_credential_sets_nothing_aside(secured: Secured, tmp_path: Path) -> None:
    operator = secured.user("operator")  # may write decisions and schemas, not events
    db = tmp_path / "a.db"

    async def record() -> None:
        async with await Ledger.open(db, targets=TARGETS) as ledger:
            await refund(ledger, Destination(), "r1")

    asyncio.run(record())
    r = effects_cli(operator, "relay", "--db", str(db))
    assert r.returncode == 1 and f"Write on topic {operator.topics.events}" in r.stderr, r.stderr
    assert [sent for _, sent in rows(db)] == [0, 0, 0]  # still in the outbox, for the right credential


def test_an_agent_whose_write_right_is_revoked_stops_calling(secured: Secured, tmp_path: Path) -> None:
    agent = secured.user("agent")
    dest = Destination()

    async def go() -> None:
        async with await Ledger.open(tmp_path / "a.db", kafka=agent, sync=True, targets=TARGETS) as ledger:
            await refund(ledger, dest, "r1")
            secured.revoke(agent, "topic", agent.topics.events, "Write")
            with pytest.raises(NotAuthorized):  # its intent is refused: no call
                for i in range(100):  # until the broker applies the change
                    await refund(ledger, dest, f"late-{i}")
            calls = len(dest.calls)
            with pytest.raises(NotAuthorized):  # known now: refused before any intent is written
                await refund(ledger, dest, "r3")
            assert len(dest.calls) == calls
            effect = await ledger.get(
                __import__("effect_ledger").effect_key("payments", "refund.create", f"late-{calls - 1}", "refund")
            )
            assert effect is not None and effect.state is State.FAILED  # the refused intent's attempt

    asyncio.run(go())


def test_a_wrong_password_or_an_untrusted_ca_is_refused_at_once(secured: Secured, tmp_path: Path) -> None:
    agent = secured.user("agent")
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=other", "-days", "1",
         "-keyout", str(tmp_path / "k"), "-out", str(other_ca)], check=True, capture_output=True,
    )  # fmt: skip
    for bad, says in [
        (replace(agent, sasl_password="wrong"), "SASL authentication"),
        (replace(agent, ssl_cafile=str(other_ca)), "certificate verify failed"),
    ]:

        async def go(cfg: KafkaConfig = bad) -> None:
            await Ledger.open(tmp_path / "b.db", kafka=cfg, targets=TARGETS)

        with pytest.raises(BrokerRefusedLogin) as e:
            asyncio.run(go())
        assert says in str(e.value)
        assert not (tmp_path / "b.db").exists()
        r = effects_cli(bad, "topics", "check")
        assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert agent.sasl_password not in r.stderr


def test_acl_apply_gives_each_role_its_rights_and_check_reports_drift(secured: Secured) -> None:
    admin = secured.admin
    names = {role: f"{role}-x{secured.admin.prefix.strip('.')}" for role in ("agent", "operator", "subscriber")}
    secured.users.extend(names.values())
    roles = [a for role, name in names.items() for a in ("--role", f"{role}={name}")]
    applied = effects_cli(admin, "acl", "--apply", *roles)
    assert applied.returncode == 0, applied.stderr
    ok = effects_cli(admin, "topics", "check", *roles)
    assert ok.returncode == 0, ok.stderr
    # One right too many and one too few: both are differences.
    secured.revoke(replace(admin, sasl_username=names["agent"]), "topic", admin.topics.events, "Write")
    extra = ["--role", f"subscriber={names['agent']}"]
    drift = effects_cli(admin, "topics", "check", "--role", f"agent={names['agent']}", *extra)
    assert drift.returncode == 1
    assert f"User:{names['agent']} (agent) lacks Write on topic {admin.topics.events}" in drift.stderr, drift.stderr
    assert f"(subscriber) has Write on topic {admin.topics.dlq}" in drift.stderr, drift.stderr
    # And an operator's credential cannot create ACLs.
    operator = secured.user("operator")
    r = effects_cli(operator, "acl", "--apply", "--role", "agent=someone")
    assert r.returncode == 1 and "Alter on the cluster" in r.stderr, r.stderr


def test_an_operator_decides_and_an_auditor_may_not(secured: Secured, tmp_path: Path) -> None:
    agent, operator, auditor = secured.user("agent"), secured.user("operator"), secured.user("auditor")
    dest = Destination()

    async def go() -> str:
        async with await Ledger.open(tmp_path / "a.db", kafka=agent, sync=True, targets=TARGETS) as ledger:
            return (await refund(ledger, dest, "r1")).effect_id

    key = asyncio.run(go())
    refused = effects_cli(auditor, "resolve", key, "--compensated", "--by", "eve", "--reason", "x")
    assert refused.returncode == 1 and f"Write on topic {auditor.topics.decisions}" in refused.stderr, refused.stderr
    taken = effects_cli(operator, "resolve", key, "--compensated", "--by", "alice", "--reason", "refunded by hand")
    assert taken.returncode == 0, taken.stderr
    decisions = consume_all(secured.admin, secured.admin.topics.decisions)
    assert len(decisions) == 1
    assert f"User:{operator.sasl_username}".encode() in decisions[0].value()  # the authenticated principal
    audit = effects_cli(auditor, "trace", key)
    assert audit.returncode == 0, audit.stderr


def test_the_services_run_with_their_roles_alone(secured: Secured, tmp_path: Path) -> None:
    """An agent killed after its intent: the worker (worker role) times it out and publishes it
    UNCERTAIN, the reconcilers (reconciler role) find it absent at the destination, the sink (sink
    role) materialises the final state, over TLS and SCRAM with nothing else allowed."""
    from effect_ledger.core.keys import effect_key
    from effect_ledger.demo.agent import write_declaration
    from effect_ledger.demo.gateway import Gateway
    from tests.services import Processor, Reconcilers, wait_for
    from tests.topic_io import run_agent

    worker, reconciler, agent, sink = (secured.user(r) for r in ("worker", "reconciler", "agent", "sink"))
    operator, subscriber, auditor = (secured.user(r) for r in ("operator", "subscriber", "auditor"))
    gateway = Gateway("lookup").start()
    services: list[Any] = []
    try:
        targets = write_declaration(tmp_path / "targets.toml", gateway.url, "lookup")
        proc = Processor(worker, tmp_path / "data")
        proc.env.update(env_of(worker))
        services.append(proc.start())
        proc.wait_ready(90)
        rec = Reconcilers(reconciler, tmp_path, ["--targets", str(targets)])
        rec.env.update(env_of(reconciler))
        services.append(rec.start())
        a = run_agent(
            agent, tmp_path / "agent", gateway.url, "after_intent", run_id="svc-1", timeout=1.5,
            extra=["--kind", "lookup", "--lookup", proc.url], env=env_of(agent),  # claims through the processor
        )  # fmt: skip
        out, _ = a.communicate(timeout=90)
        assert a.returncode != 0, out  # killed after its intent: nothing was sent
        key = effect_key("payments", "refund.create", "svc-1", "refund-order-svc-1")

        def state() -> str | None:
            status, body = proc.lookup(key)
            return body.get("state") if status == 200 else None

        try:
            wait_for(lambda: state() == State.ABSENT.value, 90, "UNCERTAIN, then ABSENT from the reconcilers")
        except TimeoutError as e:
            said = out.decode(errors="replace")[-3000:]
            raise AssertionError(f"{e}: {proc.lookup(key)}; the agent said: {said}") from None
        sunk = effects_cli(sink, "sink", "--to", f"sqlite:///{tmp_path / 'sink.db'}", "--once")
        assert sunk.returncode == 0, sunk.stderr
        with sqlite3.connect(tmp_path / "sink.db") as conn:
            assert conn.execute("SELECT state FROM effects WHERE effect_id = ?", (key,)).fetchone() == ("ABSENT",)
        # A subscriber follows the states; an auditor replays the log; an operator decides in the console.
        tail = effects_cli(subscriber, "tail", "--from-beginning", "--json", "--state", "ABSENT", "--count", "1")
        assert tail.returncode == 0 and key in tail.stdout, tail.stderr
        audit = effects_cli(auditor, "audit", "--from", "-1h", "--json")
        assert key in audit.stdout or '"uncertain"' in audit.stdout, audit.stdout + audit.stderr
        from effect_ledger.console.auth import Credentials
        from effect_ledger.console.source import Source
        from tests.console_server import serve
        from tests.unit.console.test_console_api import call, get_json

        with serve(Source(cfg=operator), Credentials("console-token")) as url:
            listed = get_json(url, "/api/effects?from=-1h")
            assert [e["effect_id"] for e in listed["effects"]] == [key], listed
            body = {"key": key, "decision": "ABANDONED", "reason": "the order was cancelled", "by": "carol"}
            status, text = call(url, "/api/resolve", body, "Bearer console-token")
            assert status == 200 and operator.topics.decisions in text, text
        # A right taken from the running worker: it says so, and is not ready (checked every 15 s).
        secured.revoke(worker, "topic", worker.topics.state, "Write")
        health = wait_for(lambda: (h := proc.health()) and not h["ready"] and h, 60, "the worker not ready")
        assert health["missing_rights"] == [f"Write on topic {worker.topics.state}"], health
        logs = proc.log() + rec.log() + sunk.stdout + sunk.stderr
        assert f"no longer gives this worker: Write on topic {worker.topics.state}" in logs
        for secret in secured.secrets:
            assert secret not in logs
    finally:
        for s in reversed(services):
            s.kill()
        gateway.stop()


@pytest.mark.parametrize("role", ["worker", "reconciler", "sink"])
def test_a_service_without_its_rights_says_which_it_lacks(secured: Secured, tmp_path: Path, role: str) -> None:
    from tests.services import free_port

    other = secured.user(None if role == "sink" else "subscriber")  # a subscriber reads state, writes nothing
    args = {
        "worker": ["worker", "--data-dir", str(tmp_path / "data"), "--web-port", str(free_port())],
        "reconciler": ["reconcile", "--targets", str(tmp_path / "t.toml")],
        "sink": ["sink", "--to", f"sqlite:///{tmp_path / 'sink.db'}", "--once"],
    }[role]
    (tmp_path / "t.toml").write_text('[targets.payments]\nlookup = "none"\n')
    r = effects_cli(other, *args)
    assert r.returncode == 1, r.stdout + r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Kafka does not allow User:" in line, r.stderr
    assert ("Read on topic" if role == "sink" else "Write on topic") in line


def test_a_certificate_for_another_host_is_refused(secure_admin: KafkaConfig, tmp_path: Path) -> None:
    """A TLS server on loopback whose certificate the broker's CA signed, but for another host: the
    client refuses it (the name check), at once and with the cause."""
    import socket
    import ssl
    import threading

    tls = Path(secure_admin.ssl_cafile or "").parent  # the broker's CA, in its run dir
    key, csr, cert, ext = (tmp_path / n for n in ("o.key", "o.csr", "o.pem", "ext"))
    ext.write_text("subjectAltName=DNS:other.example\n")
    for cmd in (
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=other.example", "-keyout", str(key),
         "-out", str(csr)],
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(tls / "ca.pem"), "-CAkey", str(tls / "ca.key"),
         "-CAcreateserial", "-CAserial", str(tmp_path / "serial"), "-days", "1", "-extfile", str(ext),
         "-out", str(cert)],
    ):  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            try:
                ctx.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                pass  # the client refused the handshake: that is the point

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        cfg = replace(secure_admin, bootstrap=f"127.0.0.1:{port}")

        async def go() -> None:
            await Ledger.open(tmp_path / "c.db", kafka=cfg, targets=TARGETS)

        with pytest.raises(BrokerRefusedLogin, match="certificate"):
            asyncio.run(go())
    finally:
        stop.set()
        t.join()
        server.close()


def test_a_reconciler_may_not_read_decisions(secured: Secured, tmp_path: Path) -> None:
    """Nor the events: asked to trace a key, it is told which right it lacks, never that the key
    is unknown or a topic missing."""
    reconciler, agent = secured.user("reconciler"), secured.user("agent")
    r = effects_cli(reconciler, "trace", "payments:" + "0" * 64)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"Describe on topic {reconciler.topics.decisions}" in r.stderr, r.stderr

    async def go() -> str:
        async with await Ledger.open(tmp_path / "a.db", kafka=agent, sync=True, targets=TARGETS) as ledger:
            return (await refund(ledger, Destination(), "r1")).effect_id

    key = asyncio.run(go())
    tail = effects_cli(reconciler, "tail", "--give-up-after", "20")  # it may not read the states
    assert tail.returncode == 1 and "not allow" in tail.stderr, tail.stderr
    r = effects_cli(reconciler, "audit", "--from", "-1h")  # it may describe the events topic, not read it
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not allow" in r.stderr and key not in r.stdout, r.stderr


def test_a_credential_is_rotated_by_moving_the_worker_to_a_second_user(secured: Secured, tmp_path: Path) -> None:
    """The worker role is given to a second user and taken from the first while its worker runs:
    the running worker says which rights it lost and stops being ready (nothing it holds is lost);
    a worker started with the old credential is refused at once (one line); one with the new
    user's takes over and folds everything, including what was written meanwhile."""
    from effect_ledger.streams.acl import rights as role_rights
    from tests.services import Processor, wait_for

    worker, agent = secured.user("worker"), secured.user("agent")
    dest = Destination()

    async def go(run: str) -> str:
        async with await Ledger.open(tmp_path / "a.db", kafka=agent, sync=True, targets=TARGETS) as ledger:
            return (await refund(ledger, dest, run)).effect_id

    proc = Processor(worker, tmp_path / "data")
    proc.env.update(env_of(worker))
    proc.start().wait_ready(90)
    try:
        key = asyncio.run(go("r1"))
        wait_for(lambda: proc.lookup(key)[1].get("state") == State.CONFIRMED.value, 60, "the worker folding")
        successor = secured.user("worker")
        for r in role_rights("worker", worker.topics):
            if r.resource == "topic" and r.pattern == "literal" and r.operation in ("Write", "Read"):
                secured.revoke(worker, "topic", r.name, r.operation)
        key2 = asyncio.run(go("r2"))  # written while the running worker has lost its rights
        # Either its rights check says so first (not ready), or its next write is refused and it
        # stops, the batch unacknowledged (the next owner reads it again): never a ready worker
        # that folds nothing.
        try:
            wait_for(lambda: not proc.alive or not (proc.health() or {}).get("ready", True), 60, "the worker not ready")
        except TimeoutError as e:
            raise AssertionError(f"{e}; health {proc.health()}; the worker's log:\n{proc.log()[-6000:]}") from None
        log = proc.log()
        assert (
            f"no longer gives this worker: Read on topic {worker.topics.events}" in log
            or "OutputRefused" in log
            and "TOPIC_AUTHORIZATION_FAILED" in log
        ), log[-3000:]
        old = effects_cli(worker, "worker", "--data-dir", str(tmp_path / "d2"), "--web-port", "6198")
        assert old.returncode == 1 and "Kafka does not allow" in old.stderr, old.stderr
        assert len(old.stderr.strip().splitlines()) == 1 and worker.sasl_password not in old.stderr
    finally:
        proc.stop()
    again = Processor(successor, tmp_path / "data")
    again.env.update(env_of(successor))
    again.start().wait_ready(90)
    try:
        for k in (key, key2):
            wait_for(lambda k=k: again.lookup(k)[1].get("state") == State.CONFIRMED.value, 60, f"{k} folded")
    finally:
        again.stop()


def test_the_admin_role_creates_checks_and_retires_without_being_a_super_user(secured: Secured) -> None:
    admin_role = secured.user("admin")
    sub = replace(admin_role, prefix=admin_role.prefix + "more.")  # under the role's prefix
    created = effects_cli(sub, "topics", "create", "--prefix", sub.prefix)
    assert created.returncode == 0 and "created" in created.stdout, created.stdout + created.stderr
    checked = effects_cli(sub, "topics", "check", "--prefix", sub.prefix)
    assert checked.returncode == 0, checked.stderr
    retired = effects_cli(admin_role, "retire", "--older-than", "30d", "--dry-run")
    assert retired.returncode == 0, retired.stderr
    outside = effects_cli(replace(admin_role, prefix="elsewhere."), "topics", "create", "--prefix", "elsewhere.")
    assert outside.returncode == 1 and len(outside.stderr.strip().splitlines()) == 1, outside.stderr
    assert "Create on topic elsewhere.effects." in outside.stderr, outside.stderr
