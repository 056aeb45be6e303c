"""The README's Java recipe, run: ``docs/subscribing/StateSubscriber.java`` (the official Apache Avro
library's ``BinaryMessageDecoder`` with a ``SchemaStore`` that reads ``effects.schemas``, and
kafka-clients) reads ``effects.state`` with today's ``EffectState.avsc`` as its reader schema,
including a record from a newer release (a field added, a state symbol added) that it learns from
the schemas topic. Needs java, and the Kafka jars the repo's broker runs from."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from effect_ledger import schemas
from effect_ledger.core import model as m
from effect_ledger.streams.codec import Codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.schema_topic import publish_schemas
from tests.newer_writer import encode, newer
from tests.topic_io import RawProducer

ROOT = Path(__file__).resolve().parents[2]


def _kafka_libs() -> Path | None:
    version = next(
        line.split("=", 1)[1].strip()
        for line in (ROOT / "scripts/kafka.env").read_text().splitlines()
        if line.startswith("KAFKA_VERSION=")
    )
    cache = Path(os.environ.get("EFFECT_LEDGER_CACHE", Path.home() / ".cache/effect-ledger"))
    libs = cache / f"kafka-{version}" / "libs"
    return libs if (libs / ".complete").exists() else None


@pytest.mark.skipif(not shutil.which("java") or _kafka_libs() is None, reason="needs java and the Kafka jars")
def test_java_subscriber_learns_a_newer_writer_from_the_schemas_topic(kafka_config: KafkaConfig) -> None:
    cfg = kafka_config
    avro_libs = subprocess.run(
        ["bash", str(ROOT / "scripts/schemas-check.sh"), "libs"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.strip()
    state_v = newer("EffectState")
    publish_schemas(cfg, [state_v])
    new_key, old_key = f"payments:{uuid.uuid4().hex}", f"payments:{uuid.uuid4().hex}"
    newer_state = {
        "effect_id": new_key, "state": "STATE_NEXT", "target": "payments", "operation": "refund.create",
        "namespace": "tests", "run_id": "r", "step": "s", "request_digest": "e" * 64, "attempt": 1, "version": 3,
        "created_ms": 1, "updated_ms": 2, "deadline_ms": None, "receipt_id": None, "executions": 0,
        "receipt_ids": [], "flags": [], "reason": None, "region": "ap",
    }  # fmt: skip
    todays = m.EffectState(old_key, m.State.CONFIRMED, "payments", "refund.create", "tests", "r", "s", "f" * 64, 1, 2,
                           1, 2, receipt_id="re_1", executions=1, receipt_ids=("re_1",))  # fmt: skip
    out = RawProducer(cfg)
    out.raw(cfg.topics.state, old_key.encode(), Codec().encode(todays))
    out.raw(cfg.topics.state, new_key.encode(), encode(state_v, newer_state))
    out.flush()

    run = subprocess.run(
        [
            "java", "-cp", f"{avro_libs}/*:{_kafka_libs()}/*", str(ROOT / "docs/subscribing/StateSubscriber.java"),
            cfg.bootstrap, cfg.prefix, str(schemas.HERE / "EffectState.avsc"), "2",
        ],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = {tuple(line.split()) for line in run.stdout.splitlines() if line.startswith("payments:")}
    # The newer symbol becomes the reader enum's default (UNCERTAIN); the added field is dropped.
    assert lines == {(old_key, "CONFIRMED", "2"), (new_key, "UNCERTAIN", "3")}, run.stdout + run.stderr[-2000:]
