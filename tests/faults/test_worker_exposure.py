"""Issue 10, item 10: ``effects worker`` listened on 0.0.0.0 although ``--web-host`` defaults to
127.0.0.1 (faust's ``web_bind`` was never set); its lookups (every event of an effect, request
bodies included) needed no credentials, and faust's own pages (``/table/...``, ``/router/``, ...)
were open. Real workers against the real broker. Also item 2 at the Kafka level: the processor's
lookup of a key made of dots reaches that key (not faust's index page)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.model import Intent
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import LedgerUnavailable
from effect_ledger.sdk.kafka.lookup import ProcessorLookup
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.admin import delete_topics, ensure_topics, list_topics
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.sdk_contract import run
from tests.services import Processor
from tests.topic_io import RawProducer, running

TOKEN = "t0ken-for-the-lookup-view"
TOKEN_ENV = "EFFECTS_WEB_TOKEN"


def _config(bootstrap: str) -> KafkaConfig:
    cfg = KafkaConfig(bootstrap=bootstrap, prefix=f"t{uuid.uuid4().hex[:12]}.", partitions=2)
    ensure_topics(cfg)
    return cfg


def _drop(cfg: KafkaConfig) -> None:
    delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])


def _start(cfg: KafkaConfig, data: Path, extra: list[str], env: dict[str, str | None]) -> Iterator[Processor]:
    proc = Processor(cfg, data)
    proc.args.extend(extra)  # click keeps the last occurrence of an option
    with pytest.MonkeyPatch.context() as mp:  # the child's environment (the harness copies ours)
        for k, v in env.items():
            if v is None:
                mp.delenv(k, raising=False)
            else:
                mp.setenv(k, v)
        with running(proc):
            proc.wait_ready()
            mp.undo()
            yield proc
    _drop(cfg)


@pytest.fixture(scope="module")
def default_worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processor]:
    """``effects worker`` with the default --web-host."""
    cfg = _config(kafka_bootstrap)
    yield from _start(cfg, tmp_path_factory.mktemp("default") / "data", [], {TOKEN_ENV: None})


@pytest.fixture(scope="module")
def exposed_worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processor]:
    """``effects worker --web-host 0.0.0.0`` with a lookup token (from the environment)."""
    cfg = _config(kafka_bootstrap)
    yield from _start(cfg, tmp_path_factory.mktemp("exposed") / "data", ["--web-host", "0.0.0.0"], {TOKEN_ENV: TOKEN})


def listening_addresses(port: int) -> set[str]:
    """The local addresses with a socket in LISTEN on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, _, hex_port = local.partition(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(addr)
            if len(raw) == 4:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def get(url: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw.decode(errors="replace")


# -- bind what the flag says ----------------------------------------------------------------------------


def test_worker_listens_only_on_loopback_by_default(default_worker: Processor) -> None:
    addrs = listening_addresses(default_worker.port)
    assert addrs == {"127.0.0.1"}, f"effects worker (default --web-host 127.0.0.1) listens on {addrs}"


@pytest.mark.parametrize(
    "path",
    [
        "/router/",
        "/router/topics",
        "/table/",
        "/table/effects/",
        "/table/effects/k/",
        "/stats/",
        "/assignment/",
        "/graph/",
        "/performance/",
    ],  # fmt: skip
)
def test_faust_debug_pages_are_not_served(default_worker: Processor, path: str) -> None:
    status, body = get(default_worker.url + path)
    assert status == 404, f"GET {path} -> {status} {str(body)[:200]}"


def test_exposed_worker_binds_what_it_was_told(exposed_worker: Processor) -> None:
    assert listening_addresses(exposed_worker.port) == {"0.0.0.0"}


# -- a token for lookups when bound beyond loopback --------------------------------------------------------


def test_exposed_worker_refuses_lookups_without_the_token(exposed_worker: Processor) -> None:
    url = f"{exposed_worker.url}/effects/payments%3Anobody"
    assert get(url)[0] == 401
    assert get(url, "wrong-token")[0] == 401
    assert get(url, "")[0] == 401
    status, body = get(url, TOKEN)
    assert (status, body.get("effect_id"), body.get("known")) == (404, "payments:nobody", False)


def test_lookup_client_sends_the_token(exposed_worker: Processor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)

    async def events(lookup: ProcessorLookup) -> list[bytes]:
        try:
            return await lookup.events("payments:nobody")
        finally:
            await lookup.close()

    with pytest.raises(LedgerUnavailable, match="401"):
        run(events(ProcessorLookup(exposed_worker.url)))
    assert run(events(ProcessorLookup(exposed_worker.url, token=TOKEN))) == []
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # or from the environment
    assert run(events(ProcessorLookup(exposed_worker.url))) == []


def test_ledger_lookup_with_a_token_executes_and_without_it_refuses(
    exposed_worker: Processor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    calls: list[str] = []

    async def body() -> None:
        targets = [Target("payments")]
        async with await Ledger.open(str(tmp_path / "a.db"), targets=targets, lookup=exposed_worker.url) as ledger:
            with pytest.raises(LedgerUnavailable, match="401"):
                await ledger.execute(
                    target="payments", operation="refund.create", run_id="r", step="s", request={}, call=calls.append
                )
        assert calls == []  # nothing was sent on an answer nobody could vouch for
        async with await Ledger.open(
            str(tmp_path / "b.db"), targets=targets, lookup=exposed_worker.url, lookup_token=TOKEN
        ) as ledger:
            c = await ledger.execute(
                target="payments", operation="refund.create", run_id="r", step="s", request={},
                call=lambda key: calls.append(key) or {"id": "re_1"},
            )  # fmt: skip
            assert c.called and c.receipt_id == "re_1"

    run(body())
    assert len(calls) == 1


def test_worker_bound_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # no broker: the refusal must come before any connection
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    for host in ("0.0.0.0", "::", "192.0.2.10", "example.internal"):
        p = subprocess.run(
            [sys.executable, "-m", "effect_ledger", "worker", "--bootstrap", f"127.0.0.1:{closed}",
             "--data-dir", str(tmp_path / "d"), "--web-host", host],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1, (host, p.returncode, p.stderr[-2000:])
        assert "token" in lines[0] and TOKEN_ENV in lines[0], lines[0]


# -- item 2, through the real processor ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["..", "."])
def test_processor_lookup_of_a_dot_key_reaches_that_key(default_worker: Processor, key: str) -> None:
    """An event whose effect_id is made of dots (another producer than the SDK may write one) is
    found by its key, instead of faust's index page being read as "unknown key"."""
    now = time.time_ns() // 1_000_000  # a deadline in the future: no timeout joins the answer
    ev = Intent(
        f"i-{uuid.uuid4().hex}", key, now, 1, "payments", "refund.create", "tests", "run-1", "step-1",
        "{}", "d" * 64, now + 60_000, "test-worker",
    )  # fmt: skip
    producer = RawProducer(default_worker.cfg)
    producer.event(ev)
    producer.flush()

    async def events() -> list[bytes]:
        lookup = ProcessorLookup(default_worker.url)
        try:
            return await lookup.events(key)
        finally:
            await lookup.close()

    got = [default_codec().decode(b) for b in run(events())]
    assert [e.event_id for e in got] == [ev.event_id, f"claim:1:{key}"]  # the intent, and its claim verdict
