"""effect-ledger's services as local child processes: the ledger processor (``effects worker``)
and the reconciliation consumers (``effects reconcile``). Used by ``effects demo --kafka`` and the
integration tests; a processor is waited for by its health view ("ready"), never by sleeping."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from effect_ledger.core.keys import key_path_segment
from effect_ledger.sdk.kafka.lookup import TOKEN_ENV
from effect_ledger.streams.config import KafkaConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("EFFECT_LEDGER_CRASH", None)
    return env


class Service:
    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log
        self.env = env or {}  # on top of this process's environment
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "effect_ledger", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**_env(), **self.env},
            start_new_session=True,
        )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no commit."""
        if self.proc is not None and self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None and self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Processor(Service):
    """``effects worker`` on a fresh port with its own data dir. ``web_host``: where it listens
    (reached through 127.0.0.1 in any case); ``token``: its lookup token, given through the
    environment (not argv, which every local user can read); ``targets``: its targets declaration."""

    def __init__(
        self,
        cfg: KafkaConfig,
        data_dir: Path,
        port: int | None = None,
        *,
        store: str = "rocksdb://",
        web_host: str = "127.0.0.1",
        token: str | None = None,
        metrics_port: int | None = None,
        targets: Path | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.metrics_port = metrics_port  # serve Prometheus /metrics there (the [metrics] extra)
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg = cfg
        self.token = token
        super().__init__(
            [
                "worker",
                "--bootstrap",
                cfg.bootstrap,
                "--prefix",
                cfg.prefix,
                "--partitions",
                str(cfg.partitions),
                "--data-dir",
                str(data_dir),
                "--web-host",
                web_host,
                "--web-port",
                str(self.port),
                "--store",
                store,
                "--loglevel",
                "info",
                *(["--metrics-port", str(metrics_port)] if metrics_port else []),
                *(["--targets", str(targets)] if targets else []),
                *(extra or []),
            ],
            data_dir.parent / f"worker-{self.port}.log",
            env={TOKEN_ENV: token} if token else None,
        )

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_ready(self, timeout: float = 90) -> Processor:
        """Ready = its web view answers (faust starts it after table recovery) and it is not
        recovering."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.alive:
                raise RuntimeError(
                    f"processor exited ({self.proc.returncode if self.proc else '?'}):\n{self.log()[-4000:]}"
                )
            h = self.health()
            if h and h.get("ready"):
                return self
            time.sleep(0.1)
        raise TimeoutError(f"processor not ready after {timeout} s:\n{self.log()[-4000:]}")

    def lookup(self, key: str) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(f"{self.url}/effects/{key_path_segment(key)}")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


class Reconcilers(Service):
    """``effects reconcile`` with the given arguments (``--targets FILE``)."""

    def __init__(self, cfg: KafkaConfig, workdir: Path, extra: list[str]) -> None:
        super().__init__(
            ["-v", "reconcile", "--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix, *extra],
            workdir / f"reconcile-{os.getpid()}-{time.monotonic_ns()}.log",
        )
