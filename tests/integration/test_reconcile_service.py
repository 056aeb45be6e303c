"""The reconciliation consumers (``effects reconcile``) with the ledger processor, both real child
processes, against the demo payment gateway: an effect left uncertain by a dead agent is resolved by
asking the gateway by key (found -> CONFIRMED, never made -> ABSENT), a target nobody can ask is
escalated, and a SIGKILL of the service between consuming and committing loses no work and writes no
contradicting resolution."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from effect_ledger.core.model import Intent, Resolution, State, UncertainEffect, Verdict
from effect_ledger.core.reconcile import answered_too_early
from effect_ledger.demo.gateway import Gateway
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.services import Processor, Reconcilers, wait_for
from tests.topic_io import Record, TopicReader, run_agent, running

WAIT = 60.0
GROUP = "effect-ledger-reconcilers"  # the service's default group (after the prefix)


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        with srv.lock:
            srv.requests.append(self.path)
        if srv.holding.is_set():
            srv.released.wait(30)
        try:
            with urllib.request.urlopen(srv.upstream + self.path, timeout=10) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the asker is gone (killed while it waited)


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    upstream: str
    requests: list[str]
    lock: threading.Lock
    holding: threading.Event
    released: threading.Event


class LookupProxy:
    """The gateway's lookup behind a proxy that records every question and can hold the answers:
    the window between "the service consumed the uncertain effect" and "it wrote the resolution"."""

    def __init__(self, upstream: str) -> None:
        self._srv = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
        self._srv.upstream = upstream
        self._srv.requests = []
        self._srv.lock = threading.Lock()
        self._srv.holding = threading.Event()
        self._srv.released = threading.Event()
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._srv.server_address[1]}"

    def asked(self, key: str) -> int:
        with self._srv.lock:
            return sum(1 for p in self._srv.requests if p.endswith("/" + key.replace(":", "%3A")) or p.endswith(key))

    def hold(self) -> None:
        self._srv.released.clear()
        self._srv.holding.set()

    def release(self) -> None:
        self._srv.holding.clear()
        self._srv.released.set()

    def __enter__(self) -> LookupProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._srv.shutdown()
        self._srv.server_close()


def intent_key(events: TopicReader, run_id: str) -> Intent:
    found = events.until(
        lambda rs: [r.value for r in rs if isinstance(r.value, Intent) and r.value.run_id == run_id],
        WAIT,
        f"the intent of run {run_id}",
    )
    return found[0]  # type: ignore[no-any-return]


def state_of(states: TopicReader, key: str, want: State) -> Any:
    def check(rs: list[Record]) -> Any:
        latest = [r.value for r in rs if r.key == key.encode()]
        return latest[-1] if latest and latest[-1].state is want else None

    return states.until(check, 120, f"{key} {want.value} on effects.state")


def resolutions(events: TopicReader) -> dict[str, list[Resolution]]:
    out: dict[str, list[Resolution]] = defaultdict(list)
    for v in events.values(Resolution):
        out[v.effect_id].append(v)
    return out


def committed(cfg: KafkaConfig, partition: int) -> int:
    """The service group's committed offset on effects.uncertain (asked without joining the group)."""
    c = Consumer(cfg.confluent(**{"group.id": f"{cfg.prefix}{GROUP}", "enable.auto.commit": False}))
    try:
        (tp,) = c.committed([TopicPartition(cfg.topics.uncertain, partition)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


def test_reconcile_service_resolves_found_absent_and_escalates(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    cfg = kafka_config
    with (
        Gateway("key+lookup") as gw,
        LookupProxy(gw.url) as proxy,
        TopicReader(cfg, cfg.topics.events) as events,
        TopicReader(cfg, cfg.topics.state) as states,
        TopicReader(cfg, cfg.topics.uncertain) as uncertain,
    ):
        proc = Processor(cfg, tmp_path / "data")
        # One declaration for the agents and the reconcilers: the gateway (asked through the proxy)
        # and a mailer nobody can ask.
        targets = tmp_path / "targets.toml"
        targets.write_text(
            f'[targets.payments]\nlookup = "{proxy.url}/refunds/by-key/{{key}}"\nhonours_keys = true\n\n'
            '[targets.mailer]\nlookup = "none"\n'
        )
        service = Reconcilers(cfg, tmp_path, ["--targets", str(targets)])
        with running(proc, service):
            proc.wait_ready()

            # A refund made at the gateway, the agent dead before recording it; and one never made.
            agents = {
                "found": run_agent(cfg, tmp_path / "a1", gw.url, "after_call", run_id="found", timeout=1.0),
                "absent": run_agent(cfg, tmp_path / "a2", gw.url, "after_intent", run_id="absent", timeout=1.0),
            }

            # A target with no reconciler that does not honour keys: the call's outcome is unknown.
            async def mail() -> str:
                db = str(tmp_path / "mailer.db")
                async with await Ledger.open(db, kafka=cfg, sync=True, targets=targets) as ledger:
                    with pytest.raises(EffectUncertain):
                        await ledger.execute(
                            target="mailer", operation="mail.send", key="mailer:receipt-mail-1",
                            request={"to": "customer"}, call=lambda k: asyncio.Event().wait(), timeout=2.0,
                        )  # fmt: skip
                return "mailer:receipt-mail-1"

            mailer = asyncio.run(mail())
            for name, a in agents.items():
                out, _ = a.communicate(timeout=WAIT)
                assert a.returncode == -9, (name, out.decode(errors="replace"))
            found, absent = intent_key(events, "found").effect_id, intent_key(events, "absent").effect_id
            (refund,) = gw.refunds()
            assert refund.idempotency_key == found

            st = state_of(states, found, State.CONFIRMED)
            assert st.receipt_id == refund.id
            state_of(states, absent, State.ABSENT)
            st = state_of(states, mailer, State.ESCALATED)
            assert "no reconciler" in (st.reason or "")

            events.drain()
            res = resolutions(events)
            assert [(r.verdict, r.reconciler, r.receipt_id) for r in res[found]] == [
                (Verdict.FOUND, "http:payments", refund.id)
            ]
            # Asked first while the call could still land (deadline + lands_within): absent then is
            # no proof, so it was asked again once it could not.
            assert [r.verdict for r in res[absent]] in ([Verdict.ABSENT], [Verdict.UNKNOWN, Verdict.ABSENT])
            assert all("may still land" in (r.reason or "") for r in res[absent][:-1])
            assert [r.verdict for r in res[mailer]] == [Verdict.ESCALATE]
            assert proxy.asked(found) == 1 and proxy.asked(absent) == len(res[absent])
            assert len(gw.refunds()) == 1  # asking never makes a refund

            # -- SIGKILL between consuming an uncertain effect and writing its resolution --------
            proxy.hold()
            late = run_agent(cfg, tmp_path / "a3", gw.url, "after_call", run_id="late", timeout=1.0)
            out, _ = late.communicate(timeout=WAIT)
            assert late.returncode == -9, out.decode(errors="replace")
            late_key = intent_key(events, "late").effect_id
            wait_for(lambda: proxy.asked(late_key), WAIT, "the service to ask the gateway about the late refund")
            service.kill()
            proxy.release()
            u = uncertain.until(
                lambda rs: [r for r in rs if r.key == late_key.encode()], 10, "the late effect's UncertainEffect"
            )
            assert len(u) == 1
            p = partition_for(late_key.encode(), cfg.partitions)
            assert committed(cfg, p) <= u[0].offset, "the offset was committed before the resolution was written"
            events.drain()
            assert late_key not in resolutions(events)

            service.start()  # the same group: it must take the uncommitted record up again
            st = state_of(states, late_key, State.CONFIRMED)
            (_, late_refund) = gw.refunds()
            assert st.receipt_id == late_refund.id and late_refund.idempotency_key == late_key
            assert proxy.asked(late_key) >= 2
            # Resolved from the uncommitted record, not from the processor re-publishing it later.
            uncertain.drain()
            assert [r.value.tries for r in uncertain.records if r.key == late_key.encode()] == [0]
            wait_for(lambda: committed(cfg, p) > u[0].offset, 30, "the service to commit after the resolution")

            # No effect was resolved twice with different verdicts; the restarted service did not
            # resolve again what was resolved (and committed) before the kill.
            events.drain()
            res = resolutions(events)
            for key, rs in res.items():
                by_attempt: dict[int, set[Verdict]] = defaultdict(set)
                for r in rs:
                    if not answered_too_early(r):  # "absent so far": not a verdict
                        by_attempt[r.attempt].add(r.verdict)
                assert all(len(v) == 1 for v in by_attempt.values()), (key, rs)
            early = len(res[absent]) - 1  # the re-asks of an absent given too early
            assert {k: len(v) for k, v in res.items()} == {found: 1, absent: 1 + early, mailer: 1, late_key: 1}
            assert len(uncertain.values(UncertainEffect)) == 4 + early
