"""The benchmark's checks on ratios (``tests.bench.common.Metric``) and its comparison with the
previous results file (``tests.bench.report``): a latency row's ratio target is a ceiling, a
throughput's a floor; per-repetition ratios, when given, are what is checked; a run compares its
figures with the file it replaces."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from tests.bench.common import BenchResult, Metric
from tests.bench.report import print_comparison, read_previous, write_json


def test_a_latency_ratio_target_is_a_ceiling_and_a_throughput_one_a_floor() -> None:
    slow = Metric("sync", "us/effect", [130.0], higher_is_better=False, raw_limit_runs=[100.0], ratio_target=1.25)
    fast = Metric("sync", "us/effect", [120.0], higher_is_better=False, raw_limit_runs=[100.0], ratio_target=1.25)
    assert (slow.passed, fast.passed) == (False, True)
    assert slow.target_text == "<= 1.25 x raw"
    low = Metric("proc", "events/s", [70.0], higher_is_better=True, raw_limit_runs=[100.0], ratio_target=0.8)
    high = Metric("proc", "events/s", [90.0], higher_is_better=True, raw_limit_runs=[100.0], ratio_target=0.8)
    assert (low.passed, high.passed) == (False, True)
    assert low.target_text == ">= 0.8 x raw"


def test_per_repetition_ratios_are_checked_rather_than_the_ratio_of_the_medians() -> None:
    # Each repetition is 1.2x its own limit; the medians of the two series are 1.5x apart.
    runs, limits = [120.0, 360.0, 600.0], [100.0, 300.0, 400.0]
    m = Metric("sync", "us/effect", runs, higher_is_better=False, raw_limit_runs=limits, ratio_target=1.25,
               ratio_runs=[1.2, 1.2, 1.5])  # fmt: skip
    assert m.median / m.raw == 360.0 / 300.0
    assert m.ratio == 1.2 and m.passed is True
    assert m.to_json()["ratio_runs"] == [1.2, 1.2, 1.5]


def test_a_run_is_compared_with_the_results_file_it_replaces(tmp_path: Path) -> None:
    out = tmp_path / "bench-results.json"
    assert read_previous(out) is None
    before = BenchResult("sdk_peers", "ran", [Metric("SyncLedger.execute NORMAL", "us/effect", [500.0], False,
                                                     raw_limit_runs=[300.0])])  # fmt: skip
    write_json(out, [before], {"started": "2026-12-05T18:00:00+00:00"})
    previous = read_previous(out)
    assert previous is not None and previous["started"] == "2026-12-05T18:00:00+00:00"
    now = BenchResult("sdk_peers", "ran", [Metric("SyncLedger.execute NORMAL", "us/effect", [400.0], False,
                                                  raw_limit_runs=[320.0])])  # fmt: skip
    buf = io.StringIO()
    print_comparison(Console(file=buf, width=200), [now], previous)
    line = next(row for row in buf.getvalue().splitlines() if "SyncLedger.execute NORMAL" in row)
    assert "500" in line and "400" in line and "1.67" in line and "1.25" in line


def test_an_unreadable_results_file_is_no_previous_run(tmp_path: Path) -> None:
    p = tmp_path / "bench-results.json"
    p.write_text("{not json")
    assert read_previous(p) is None
    p.write_text(json.dumps({"benchmarks": "no"}))
    assert read_previous(p) is None
