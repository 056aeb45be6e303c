"""``effects assess`` on OpenAI Agents SDK trace spans: the SDK's own function and generation spans,
exported by its own ``Span.export()`` to a tracing processor, with the SDK's clock (its trace
provider's ``time_iso``) set to the generated month; the rows must recover what
``tests/assess_gen.py`` injected. Runs in .venv-openai-agents (``make test``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.tracing import (
    SpanError,
    TracingProcessor,
    function_span,
    generation_span,
    get_trace_provider,
    set_trace_processors,
    set_trace_provider,
    trace,
)
from agents.tracing.provider import DefaultTraceProvider
from click.testing import CliRunner

from effect_ledger.cli.main import main
from tests.assess_gen import WRITES, Scenario, check, scenario


class Clock(DefaultTraceProvider):
    """The SDK's provider, telling the generated time instead of the wall clock."""

    now = ""

    def time_iso(self) -> str:
        return self.now


class ToFile(TracingProcessor):
    """Writes each ended span's export as a JSON line (what a file-backed tracing processor keeps)."""

    def __init__(self, path: Path) -> None:
        self.fp = path.open("w")

    def on_trace_start(self, trace: Any) -> None:
        pass

    def on_trace_end(self, trace: Any) -> None:
        pass

    def on_span_start(self, span: Any) -> None:
        pass

    def on_span_end(self, span: Any) -> None:
        exported = span.export()
        if exported is not None:
            self.fp.write(json.dumps(exported) + "\n")

    def shutdown(self) -> None:
        self.fp.close()

    def force_flush(self) -> None:
        self.fp.flush()


def agents_log(sc: Scenario, path: Path) -> None:
    previous = get_trace_provider()
    clock = Clock()
    set_trace_provider(clock)
    sink = ToFile(path)
    set_trace_processors([sink])
    try:
        for n, a in enumerate(sc.attempts):
            assert a.end_ms is not None  # the SDK exports a span when it ends
            clock.now = a.iso(a.start_ms) or ""
            with trace(f"run {a.call_id}"):
                if n % 4 == 0:
                    with generation_span(model="fake"):
                        pass
                span = function_span(a.tool, input=json.dumps(a.arguments()))
                span.start()
                if a.error:
                    span.set_error(SpanError(message=a.error, data=None))
                clock.now = a.iso(a.end_ms) or ""
                span.finish()
    finally:
        sink.shutdown()
        set_trace_processors([])
        set_trace_provider(previous)


def test_assess_recovers_what_was_injected_from_agents_spans(tmp_path: Path) -> None:
    sc = scenario(pending=False)
    log = tmp_path / "spans.jsonl"
    agents_log(sc, log)
    r = CliRunner().invoke(main, ["assess", str(log), "--writes", ",".join(WRITES), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["format"] == "openai-agents" and report["bad_lines"]["count"] == 0
    assert report["records_not_tool_calls"] > 0  # the generation spans, skipped
    check(report, sc)
