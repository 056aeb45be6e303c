"""Fault: in Kafka mode a target's backoff was ignored (issue 12, item 2).

The embedded runner spaced the checks of an uncertain effect by its target's ``backoff``; the
ledger processor, which re-publishes uncertain effects to the reconcilers, used one default backoff
(1 s, doubling) for every target. A destination declared ``backoff = { first = "1h" }`` (say, an
API with a strict rate limit) was asked again after a second. Now the processor reads the same
targets declaration (``effects worker --targets``) and both modes use one rule
(``effect_ledger.core.reconcile.next_check_ms``).

No timing is asserted: two targets are asked in the same run, one with a one-hour backoff and one
with a short one, and the destination answers "unknown" every time. The short one is asked three
times and escalated; by then, under the old rule, the slow one had been asked again too (its second
ask came a backoff of 1 s after the first, before the quick one's third); under its own backoff it
has been asked once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from effect_ledger.core.model import State
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from tests.faults.http_servers import LoopbackServer, Reply
from tests.services import Processor, Reconcilers, wait_for
from tests.topic_io import running

WAIT = 90.0


def declaration(path: Path, url: str) -> Path:
    path.write_text(
        f"""
[targets.slow]
lookup = "{url}/slow/{{key}}"
backoff = {{ first = "1h", factor = 1, tries = 3 }}

[targets.quick]
lookup = "{url}/quick/{{key}}"
backoff = {{ first = "50ms", factor = 1, tries = 3 }}
"""
    )
    return path


def asks(srv: LoopbackServer, target: str) -> int:
    with srv.lock:
        return sum(1 for s in srv.seen if s.path.startswith(f"/{target}/"))


def test_each_target_is_asked_again_after_its_own_backoff(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    with LoopbackServer(lambda _path: Reply(503, b"busy")) as dest:
        targets = declaration(tmp_path / "targets.toml", dest.url)
        proc = Processor(kafka_config, tmp_path / "data", targets=targets)
        with running(proc), running(Reconcilers(kafka_config, tmp_path, ["--targets", str(targets)])):
            proc.wait_ready()

            async def write() -> dict[str, str]:
                async with await Ledger.open(str(tmp_path / "agent.db"), targets=targets, kafka=kafka_config) as led:
                    keys = {}
                    for name in ("slow", "quick"):

                        def reset(_key: str) -> None:
                            raise ConnectionError("connection reset")

                        with pytest.raises(EffectUncertain) as raised:
                            await led.execute(
                                target=name, operation="charge", run_id="run-1", step=name, request={"n": 1},
                                call=reset, timeout=30,
                            )  # fmt: skip
                        keys[name] = raised.value.effect_id
                    end = time.monotonic() + WAIT
                    while await led.store.outbox_depth() > 0:  # both effects' events acknowledged by Kafka
                        assert time.monotonic() < end, "the relay did not drain the outbox"
                        await asyncio.sleep(0.02)
                    return keys

            keys = asyncio.run(write())

            def state(name: str) -> str | None:
                status, body = proc.lookup(keys[name])
                return body.get("state") if status == 200 else None

            # The quick target: asked, then again after 50 ms, then a third time, and escalated.
            wait_for(lambda: state("quick") == State.ESCALATED.value, WAIT, "the quick target's effect to escalate")
            assert asks(dest, "quick") == 3
            # The slow target was asked once (in the same run); its next check is an hour away.
            assert asks(dest, "slow") == 1, f"the slow target was asked {asks(dest, 'slow')} times"
            assert state("slow") == State.UNCERTAIN.value
