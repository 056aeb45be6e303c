"""``effects demo --kafka --keep`` leaves the demo's topics on the broker and prints the commands that
read them; each works as printed (``effects tail`` follows until stopped, so it is read until the
effect's CONFIRMED state shows and then stopped). Without ``--keep`` the demo deletes its topics.
A real broker, the real processor and reconcilers the demo starts, the real command line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from effect_ledger.streams.admin import delete_topics, list_topics
from effect_ledger.streams.config import KafkaConfig

EFFECTS = Path(sys.executable).with_name("effects")


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="250")
    return subprocess.run([str(EFFECTS), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _prefixes(cfg: KafkaConfig) -> set[str]:
    return {t.split(".", 1)[0] + "." for t in list_topics(cfg) if t.startswith("demo")}


def test_kept_topics_answer_the_printed_commands(kafka_bootstrap: str, tmp_path: Path) -> None:
    cfg = KafkaConfig(bootstrap=kafka_bootstrap)
    before = _prefixes(cfg)
    r = _run(["demo", "--kafka", "--keep", "--bootstrap", kafka_bootstrap], tmp_path)
    prefix = None
    try:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        m = re.search(r"The topics (demo[0-9a-f]+\.)effects\.\* stay on", r.stdout)
        assert m, r.stdout[-2000:]
        prefix = m[1]
        assert prefix in _prefixes(cfg) - before  # the topics are still there
        # Each step names the program as a shell reaches it: `effects`, or its path when not on PATH.
        steps = [ln.strip() for ln in r.stdout.splitlines() if re.match(r"  \S*effects ", ln)]
        assert all(shlex.split(s)[0] in ("effects", str(EFFECTS)) for s in steps), steps
        assert [shlex.split(s)[1] for s in steps] == ["tail", "trace", "audit"]
        assert "make kafka-down" in r.stdout
        tail, trace, audit = (shlex.split(s)[1:] for s in steps)

        t = _run(trace, tmp_path, timeout=120)
        assert t.returncode == 0, t.stderr
        assert "state: CONFIRMED" in t.stdout
        a = _run([*audit, "--json"], tmp_path, timeout=120)
        assert a.returncode == 0, a.stderr  # piped: a failed check would exit 1
        report = json.loads(a.stdout)
        assert report["passed"] is True and report["events"] >= 3

        # tail follows for ever: read it until the effect's last state shows, then stop it.
        proc = subprocess.Popen(
            [str(EFFECTS), *tail], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, COLUMNS="250"),
        )  # fmt: skip
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("CONFIRMED" in ln for ln in seen) and proc.poll() is None:
            reader.join(0.1)
        proc.terminate()
        proc.wait(timeout=30)
        states = [ln.split()[1] for ln in seen if ln.strip()]
        assert states[-1:] == ["CONFIRMED"] and "PENDING" in states, seen
    finally:
        if prefix is not None:
            delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(prefix)])


def test_without_keep_the_demo_leaves_no_topic(kafka_bootstrap: str, tmp_path: Path) -> None:
    cfg = KafkaConfig(bootstrap=kafka_bootstrap)
    before = _prefixes(cfg)
    r = _run(["demo", "--kafka", "--bootstrap", kafka_bootstrap], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "stay on" not in r.stdout
    assert _prefixes(cfg) - before == set()
