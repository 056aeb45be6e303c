"""Workers of one group join, are SIGKILLed and restart (same data dir, or an empty one)
while events flow. Afterwards every key's published state (effects.state) and its lookup must equal
a single in-order fold of its events: nothing lost, nothing doubled, no key stuck PENDING whose
events were all written. Lookups through a restarted worker used to answer "no worker owns the
partition" for keys of the other worker: its lookup asked the broker for the high watermark through
faust's consumer, behind fetches and commits, beyond the forwarding worker's patience."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from effect_ledger.streams.config import KafkaConfig
from tests.faults._flow import Flow, describe, mismatches
from tests.services import Processor, wait_for
from tests.topic_io import TopicReader, running

WAIT = 150.0


def _until(seconds: float) -> None:
    time.sleep(seconds)  # pacing of the scenario only, never an assertion


@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", ["join", "kill", "kill-restart-same-dir", "kill-restart-empty-dir", "churn"])
def test_every_event_is_folded_through_rebalances(kafka_config: KafkaConfig, tmp_path: Path, scenario: str) -> None:
    flow = Flow(kafka_config, scenario, keys=600, seconds=20)
    a = Processor(kafka_config, tmp_path / "data-a")
    b = Processor(kafka_config, tmp_path / "data-b")
    with running(a), TopicReader(kafka_config, kafka_config.topics.state) as states:
        a.wait_ready()
        flow.start()
        _until(4)
        with running(b):
            if scenario == "join":
                pass
            else:
                _until(5)
                a.kill()
                if scenario == "kill-restart-same-dir":
                    _until(2)
                    a.start()
                elif scenario == "kill-restart-empty-dir":
                    _until(2)
                    shutil.rmtree(tmp_path / "data-a")
                    a.start()
                elif scenario == "churn":
                    _until(2)
                    a.start()
                    _until(4)
                    b.kill()
                    _until(2)
                    b.start()
            flow.join()
            live = [p for p in (a, b) if p.alive]
            assert live, "no worker runs"
            for p in live:
                p.wait_ready(WAIT)
            expected = flow.expected()
            try:
                wait_for(lambda: not mismatches(states, expected), WAIT, "every key's state to equal a single fold")
            except TimeoutError as e:
                h = {p.url: p.health() for p in live}
                raise AssertionError(f"{e}: {describe(mismatches(states, expected))}; health {h}") from None
            # And the lookups answer the same.
            wrong = {}

            def check(k: str) -> None:
                want = expected[k]
                end = time.monotonic() + 60  # a 503 (rebalancing, lagging) is an answer to retry
                while True:
                    status, body = live[0].lookup(k)
                    if status != 503 or time.monotonic() > end:
                        break
                    time.sleep(0.5)
                if status != 200 or body.get("state") != want.state.value or body.get("version") != want.version:
                    wrong[k] = (status, body, want.state.value, want.version)

            with ThreadPoolExecutor(16) as pool:
                list(pool.map(check, list(expected)[::10]))
            assert not wrong, f"{len(wrong)} lookups differ, e.g. {list(wrong.items())[:5]}"
