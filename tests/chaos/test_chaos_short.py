"""The short chaos run (``python -m tests.chaos --short``, fixed seed): every fault kind once on the
three-broker cluster in its network namespaces, with two agent hosts, two workers and a reconciler
under load. It must find no anomaly (nothing lost, doubled, wrongly decided or missing, no claim
won twice), and after every heal calls must complete again. ``make chaos`` is the long run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.nemesis import KINDS

ROOT = Path(__file__).resolve().parents[2]
SEED = 7
RUN_CAP_S = 1200  # the run takes about 6 minutes; a hung one fails here instead of stalling CI


def run_chaos(out: Path) -> tuple[int, str]:
    """The short run; stopped with SIGTERM (its own cleanup: children, cluster, namespaces) if it
    outlives RUN_CAP_S or the test is interrupted."""
    log = out.parent / "chaos.log"
    with open(log, "w") as f:
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos", "--short", "--seed", str(SEED), "--hold", "10", "--gap", "8",
             "--out", str(out)],
            cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            code = p.wait(RUN_CAP_S)
        finally:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(180)
                except subprocess.TimeoutExpired:
                    p.kill()
    return code, log.read_text(errors="replace")[-3000:]


@pytest.mark.timeout(RUN_CAP_S + 240)
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nftables need root")
def test_every_fault_kind_once_leaves_no_anomaly_and_every_heal_recovers(tmp_path: Path) -> None:
    out = tmp_path / "report"
    code, tail = run_chaos(out)
    assert code != 2, f"the chaos run could not be made:\n{tail}"
    report = json.loads((out / "chaos-report.json").read_text())
    anomalies = {k: v for k, v in report["anomalies"].items() if v}
    assert code == 0 and not anomalies, f"anomalies: {json.dumps(anomalies, indent=1)[:3000]}\n{tail}"
    ran = {f["kind"] for f in report["faults"]}
    assert ran == set(KINDS), f"fault kinds that did not run: {sorted(set(KINDS) - ran)}\n{tail}"
    # The load was real and mostly served. How much of it completes while faults hold is a figure
    # of `make chaos`'s report, not a threshold here: it moves with the machine's load (43% of the
    # calls of this run completed on a machine running a full test suite beside it, 64% in the
    # 30-minute run alone); a system that stopped serving would still fail this and the next check.
    assert report["counts"]["ok"] > 0.25 * report["counts"]["calls"], report["counts"]
    stuck = [f["what"] for f in report["faults"] if f["recovery_s"] is None]
    assert not stuck, f"calls did not complete again after the heal of: {stuck}"
    print((out / "chaos-report.md").read_text())
