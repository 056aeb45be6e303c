"""The system the nemesis works on: three destinations (``tests.soak.destinations``, in the host
namespace on the bridge's address), two ``effects worker`` processes (namespaces w1, w2), one
``effects reconcile`` (r) and two agent hosts (``tests.chaos.agent``, namespaces a and b), each
process a child of the harness, each startable with its wall clock skewed (libfaketime)."""

from __future__ import annotations

import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from effect_ledger.streams.config import KafkaConfig
from tests.chaos import net
from tests.soak.destinations import declaration

WEB_PORT = 6066
HERE = Path(__file__).resolve().parent


class Child:
    """One process of the run, in its side's namespace. ``start(skew=...)`` runs it with its wall
    clock that far off (libfaketime, as ``FAKETIME`` says it: "+2h", "-2h")."""

    def __init__(self, name: str, side: str, argv: list[str], log: Path, env: dict[str, str], preload: str) -> None:
        self.name, self.side, self.argv, self.log, self.env, self.preload = name, side, argv, log, env, preload
        self.proc: subprocess.Popen[bytes] | None = None
        self.skew: str | None = None
        self.paused = False

    def start(self, skew: str | None = None) -> Child:
        env = {**os.environ, **self.env}
        env.pop("EFFECT_LEDGER_CRASH", None)
        self.skew = skew
        if skew is not None:
            env.update({"LD_PRELOAD": self.preload, "FAKETIME": skew})
        with open(self.log, "ab") as f:
            f.write(f"--- start {self.name} skew={skew}\n".encode())
            f.flush()
            self.proc = subprocess.Popen(net.in_ns(self.side, self.argv), stdout=f, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)  # fmt: skip
        self.paused = False
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.alive:
            self.proc.send_signal(sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 45) -> None:
        if self.proc is None or not self.alive:
            return
        self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def faketime_preload(workdir: Path) -> str:
    """LD_PRELOAD for a skewed child: the shim that keeps librdkafka's waits on real time, then
    libfaketime (scripts/install-faketime.sh installs both)."""
    libs = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not libs:
        raise RuntimeError("libfaketime is missing: scripts/install-faketime.sh installs Debian's faketime")
    shim = workdir / "realtime_waits.so"
    src = HERE.parent / "faults" / "faketime" / "realtime_waits.c"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(src), "-ldl"], check=True)
    return f"{shim}:{libs[0]}"


class World:
    def __init__(self, wd: Path, prefix: str, partitions: int, rate: float, timeout: float) -> None:
        self.wd, self.rate, self.timeout = wd, rate, timeout
        self.cfg = KafkaConfig(bootstrap=net.bootstrap(), prefix=prefix, partitions=partitions)
        self.token = secrets.token_urlsafe(24)
        self.preload = faketime_preload(wd)
        self.dest: subprocess.Popen[bytes] | None = None
        self.urls: dict[str, str] = {}
        self.workers: dict[str, Child] = {}
        self.reconciler: Child | None = None
        self.agents: dict[str, Child] = {}
        self.incarnations: dict[str, int] = {}
        self.unexpected: list[str] = []  # children that exited on their own
        self.takeovers: list[Child] = []  # one-shot successors of a frozen agent host

    def _py(self, *args: str) -> list[str]:
        return [sys.executable, *args]

    def start_destinations(self, lost: float, slow: float) -> None:
        self.dest = subprocess.Popen(
            self._py("-m", "tests.soak.destinations", "--host", net.HOST_ADDR, "--lost", str(lost), "--slow",
                     str(slow), "--slow-delay", str(self.timeout + 1.5)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=net.ROOT,
            stderr=open(self.wd / "destinations.log", "ab"),  # noqa: SIM115
        )  # fmt: skip
        assert self.dest.stdout is not None
        self.urls = json.loads(self.dest.stdout.readline())
        self.targets = self.wd / "targets.toml"
        self.targets.write_text(declaration(self.urls))

    def _kafka_args(self) -> list[str]:
        c = self.cfg
        return ["--bootstrap", c.bootstrap, "--prefix", c.prefix, "--partitions", str(c.partitions)]

    def start_services(self) -> None:
        env = {"EFFECTS_WEB_TOKEN": self.token}
        for name in ("w1", "w2"):
            host = net.addr(name)
            argv = self._py("-m", "effect_ledger", "worker", *self._kafka_args(), "--data-dir",
                            str(self.wd / f"data-{name}"), "--web-host", host, "--web-port", str(WEB_PORT),
                            "--advertised-url", f"http://{host}:{WEB_PORT}", "--targets", str(self.targets),
                            "--loglevel", "info")  # fmt: skip
            self.workers[name] = Child(name, name, argv, self.wd / f"{name}.log", env, self.preload).start()
        argv = self._py("-m", "effect_ledger", "-v", "reconcile", *self._kafka_args(), "--targets", str(self.targets))
        self.reconciler = Child("r", "r", argv, self.wd / "r.log", {}, self.preload).start()

    def health(self, name: str) -> dict[str, Any] | None:
        try:
            url = f"http://{net.addr(name)}:{WEB_PORT}/health"
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        except Exception:
            return None

    def wait_ready(self, timeout: float = 180) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            hs = [self.health(n) or {} for n in self.workers]
            owned = sum(len(h.get("partitions") or ()) for h in hs)
            if all(h.get("ready") for h in hs) and owned == self.cfg.partitions:
                return
            for w in self.workers.values():
                if not w.alive:
                    # The run's folder is removed afterwards: its last lines go with the error.
                    tail = "\n".join(w.log.read_text(errors="replace").splitlines()[-25:])
                    raise RuntimeError(f"worker {w.name} exited: see {w.log}; its last lines:\n{tail}")
            time.sleep(0.5)
        raise TimeoutError(f"the workers did not own the {self.cfg.partitions} partitions within {timeout} s")

    def _agent_argv(self, name: str, incarnation: int) -> list[str]:
        # Each host asks the worker beside it first, and the other one when that one cannot answer.
        lookup = self._lookup_urls("w1" if name == "a" else "w2")
        return self._py("-m", "tests.chaos.agent", "--db", str(self.wd / f"host-{name}.db"), "--history",
                        str(self.wd / f"history-{name}.jsonl"), *self._kafka_args(), "--targets",
                        str(self.targets), "--urls", json.dumps(self.urls), "--lookup", lookup, "--rate",
                        str(self.rate), "--host", name,
                        "--timeout", str(self.timeout), "--incarnation", str(incarnation))  # fmt: skip

    def _lookup_urls(self, first: str) -> str:
        """Every worker's lookup URL, ``first`` first."""
        names = sorted(self.workers, key=lambda n: n != first)
        return ",".join(f"http://{net.addr(n)}:{WEB_PORT}" for n in names)

    def start_agents(self) -> None:
        for name in ("a", "b"):
            env = {"EFFECTS_WEB_TOKEN": self.token, "PYTHONPATH": str(net.ROOT)}
            self.incarnations[name] = 0
            self.agents[name] = Child(name, name, self._agent_argv(name, 0), self.wd / f"agent-{name}.log", env,
                                      self.preload).start()  # fmt: skip

    def restart(self, child: Child, skew: str | None) -> None:
        """Stop ``child`` (SIGTERM: an agent host finishes its calls in flight) and start it again with
        its wall clock ``skew`` off (None: the real clock); an agent host starts a fresh key series."""
        child.stop(60)
        if child.name in self.agents:
            self.incarnations[child.name] += 1
            child.argv = self._agent_argv(child.name, self.incarnations[child.name])
        child.start(skew)

    def start_takeover(self, victim: str) -> Child:
        """A successor of agent host ``victim`` in the other host's namespace: it executes the calls
        ``victim`` started and did not finish (``tests.chaos.takeover``), with a ledger file of its own."""
        side = "a" if victim == "b" else "b"
        n = len(self.takeovers)
        name = f"t{n}"
        argv = self._py("-m", "tests.chaos.takeover", "--history-of", str(self.wd / f"history-{victim}.jsonl"),
                        "--db", str(self.wd / f"takeover-{n}.db"), "--history", str(self.wd / f"history-{name}.jsonl"),
                        *self._kafka_args(), "--targets", str(self.targets), "--urls", json.dumps(self.urls),
                        "--lookup", self._lookup_urls("w1" if side == "a" else "w2"), "--host", name,
                        "--timeout", str(self.timeout))  # fmt: skip
        env = {"EFFECTS_WEB_TOKEN": self.token, "PYTHONPATH": str(net.ROOT)}
        child = Child(name, side, argv, self.wd / f"takeover-{n}.log", env, self.preload).start()
        self.takeovers.append(child)
        return child

    def wait_takeovers(self, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        for t in self.takeovers:
            if t.proc is not None:
                try:
                    t.proc.wait(max(1.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    t.stop()

    def children(self) -> list[Child]:
        return [*self.workers.values(), *([self.reconciler] if self.reconciler else []), *self.agents.values()]

    def stop_agents(self) -> None:
        for a in self.agents.values():
            a.stop(60)

    def stop(self) -> None:
        for c in [*self.takeovers, *self.children()]:
            c.stop()
        if self.dest is not None and self.dest.poll() is None:
            assert self.dest.stdin is not None
            self.dest.stdin.close()
            self.dest.wait(30)

    def refunds(self) -> dict[str, list[dict[str, Any]]]:
        """Every destination's own record: target -> its refunds (idempotency key, amount, id)."""
        out = {}
        for name, url in self.urls.items():
            with urllib.request.urlopen(f"{url}/_admin/refunds", timeout=60) as r:
                out[name] = json.loads(r.read())["refunds"]
        return out
