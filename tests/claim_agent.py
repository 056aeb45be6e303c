"""An agent process for the cross-host claim race (tests/faults/test_cross_host_claims.py) and its
benchmark (tests/bench/claims.py): its own ledger file, Kafka mode with ``sync=True`` and a lookup,
a refund target on a real HTTP gateway. It reads one key per line on stdin, executes it (a POST to
the gateway with the key) and prints one JSON line per key: the outcome and how long it took.
``execute KEY TAG`` puts TAG in the request, so two hosts can race on one key with different requests.

    python -m tests.claim_agent DB BOOTSTRAP PREFIX PARTITIONS LOOKUP_URL GATEWAY_URL
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from effect_ledger.core.reconcile import Target
from effect_ledger.errors import DefiniteFailure, EffectConflict, EffectInProgress, LedgerError, LedgerUnavailable
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig


class Rejected(DefiniteFailure):
    """The gateway said no (400): nothing happened."""


def refund(gateway: str, key: str) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{gateway}/refunds",
        data=json.dumps({"order": key, "amount": 100, "currency": "EUR"}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as e:
        if e.code == 400:
            raise Rejected(f"gateway: {e.code}") from e
        raise


TIMEOUT_S = float(os.environ.get("CLAIM_AGENT_TIMEOUT_S", "30"))  # each execute's timeout
# The ledger's confirm_within (s), else its default.
_CONFIRM_S = os.environ.get("CLAIM_AGENT_CONFIRM_WITHIN_S")
CONFIRM = {"confirm_within": float(_CONFIRM_S)} if _CONFIRM_S else {}


async def main(db: str, bootstrap: str, prefix: str, partitions: int, lookup: str, gateway: str) -> None:
    cfg = KafkaConfig(bootstrap=bootstrap, prefix=prefix, partitions=partitions)
    async with await Ledger.open(
        db, targets=[Target("payments")], kafka=cfg, sync=True, lookup=lookup, **CONFIRM
    ) as ledger:
        print(json.dumps({"ready": ledger.worker}), flush=True)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line.strip():
                return
            op, _, rest = line.strip().partition(" ")
            key, _, tag = rest.partition(" ")
            request = {"order": key, "amount": tag} if tag else {"order": key}
            t0 = time.perf_counter()
            out: dict[str, Any] = {"key": key}
            try:
                if op == "lookup":
                    await ledger._merge_remote(key, await ledger.store.load(key))
                    out["outcome"] = "looked-up"
                else:
                    c = await ledger.execute(
                        target="payments", operation="refund.create", key=key, request=request,
                        call=lambda k: asyncio.to_thread(refund, gateway, k), timeout=TIMEOUT_S,
                    )  # fmt: skip
                    out["outcome"] = "called" if c.called else "recorded"
                    out["receipt"] = c.receipt_id
            except Rejected as e:
                out["outcome"] = "rejected"
                out["reason"] = str(e)
            except LedgerUnavailable as e:
                out["outcome"] = "unavailable"
                out["reason"] = str(e)
            except EffectConflict as e:
                out["outcome"] = "conflict"
                out["reason"] = str(e)
            except EffectInProgress as e:
                out["outcome"] = "in-progress"
                out["reason"] = e.reason
            except LedgerError as e:
                out["outcome"] = f"error: {type(e).__name__}: {e}"
            out["ms"] = (time.perf_counter() - t0) * 1000
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], int(a[3]), a[4], a[5]))


class AgentProcess:
    """The parent's side: start ``python -m tests.claim_agent``, send it commands, read its answers
    with a deadline (a reader thread, so a hung agent fails the test instead of hanging it)."""

    def __init__(
        self,
        db: str,
        cfg: KafkaConfig,
        lookup: str,
        gateway: str,
        log_path: str,
        timeout_s: float | None = None,
        confirm_within: float | None = None,
    ) -> None:
        import subprocess

        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.claim_agent", db, cfg.bootstrap, cfg.prefix, str(cfg.partitions),
             lookup, gateway],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, **({"CLAIM_AGENT_TIMEOUT_S": str(timeout_s)} if timeout_s is not None else {}),
                 **({"CLAIM_AGENT_CONFIRM_WITHIN_S": str(confirm_within)} if confirm_within is not None else {})},
        )  # fmt: skip
        import queue
        import threading

        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.worker = str(self.answer(120)["ready"])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 60) -> dict[str, Any]:
        import queue

        try:
            return json.loads(self._lines.get(timeout=timeout))  # type: ignore[no-any-return]
        except queue.Empty:
            raise TimeoutError(f"agent {self.proc.pid} gave no answer in {timeout} s") from None

    def stop(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # an empty line: the agent closes its ledger and exits
            except OSError:
                pass
        try:
            self.proc.wait(30)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
