"""``effects assess`` on logs written by the real libraries: the OpenTelemetry SDK (GenAI tool spans
encoded by its own OTLP encoder, as the Collector's file exporter writes them), LangSmith's run trees
serialised as its client posts them, Langfuse's observation export model, HTTP access logs; each must
recover exactly what ``tests/assess_gen.py`` injected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from tests.assess_gen import WRITES, Scenario, check, scenario


def run(log: Path, *extra: str) -> dict[str, Any]:
    r = CliRunner().invoke(main, ["assess", str(log), "--writes", ",".join(WRITES), "--json", *extra])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def otlp_log(sc: Scenario, path: Path) -> None:
    """GenAI ``execute_tool`` spans from the SDK, exported in batches by its BatchSpanProcessor and
    encoded by its OTLP encoder (one ExportTraceServiceRequest as JSON per line)."""
    from google.protobuf.json_format import MessageToJson
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind, Status, StatusCode

    class FileExporter(SpanExporter):
        def __init__(self) -> None:
            self.fp = path.open("w")

        def export(self, spans: Any) -> SpanExportResult:
            self.fp.write(MessageToJson(encode_spans(spans), indent=None) + "\n")
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            self.fp.close()

    provider = TracerProvider(resource=Resource.create({"service.name": "refund-agent"}))
    provider.add_span_processor(BatchSpanProcessor(FileExporter(), max_export_batch_size=64))
    tracer = provider.get_tracer("agent")
    for n, a in enumerate(sc.attempts):
        assert a.end_ms is not None  # OpenTelemetry exports a span only when it ends
        if n % 7 == 0:  # model calls between the tools: not tool calls, skipped
            chat = tracer.start_span("chat", start_time=a.start_ms * 1_000_000 - 5_000_000)
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.end(end_time=a.start_ms * 1_000_000 - 1_000_000)
        span = tracer.start_span(f"execute_tool {a.tool}", kind=SpanKind.INTERNAL, start_time=a.start_ms * 1_000_000)
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", a.tool)
        span.set_attribute("gen_ai.tool.call.id", a.call_id)
        span.set_attribute("gen_ai.tool.call.arguments", json.dumps(a.arguments()))
        if a.error:
            span.set_attribute("error.type", a.error.split(":")[0])
            span.set_status(Status(StatusCode.ERROR, a.error))
        span.end(end_time=a.end_ms * 1_000_000)
    provider.shutdown()


def langsmith_log(sc: Scenario, path: Path) -> None:
    """Tool runs (and LLM runs around them) as LangSmith's RunTree serialises them for its API."""
    from langsmith._internal._serde import dumps_json
    from langsmith.run_trees import RunTree

    with path.open("wb") as fp:
        for n, a in enumerate(sc.attempts):
            if n % 5 == 0:
                llm = RunTree(name="ChatModel", run_type="llm", inputs={"messages": []}, start_time=a.start)
                llm.end(outputs={"generations": []}, end_time=a.start)
                fp.write(dumps_json(llm._get_dicts_safe()) + b"\n")
            rt = RunTree(name=a.tool, run_type="tool", inputs=a.arguments(), start_time=a.start,
                         extra={"metadata": {"tool_call_id": a.call_id}})  # fmt: skip
            if a.end is not None:
                rt.end(outputs=None if a.error else {"ok": True}, error=a.error, end_time=a.end)
            fp.write(dumps_json(rt._get_dicts_safe()) + b"\n")


def langfuse_log(sc: Scenario, path: Path) -> None:
    """Observations as Langfuse's API model serialises them (the observations export)."""
    from langfuse.api.commons.types.observation_v2 import ObservationV2

    with path.open("w") as fp:
        for n, a in enumerate(sc.attempts):
            common = {"trace_id": f"t-{a.call_id}", "project_id": "p1", "start_time": a.start}
            if n % 6 == 0:
                gen = ObservationV2(id=f"g{n}", type="GENERATION", name="chat", end_time=a.start, **common)
                fp.write(gen.json() + "\n")
            obs = ObservationV2(
                id=f"o{n}", type="TOOL", name=a.tool, end_time=a.end, input=a.arguments(),
                level="ERROR" if a.error else "DEFAULT", status_message=a.error,
                metadata={"tool_call_id": a.call_id}, **common,
            )  # fmt: skip
            fp.write(obs.json() + "\n")


def calls_log(sc: Scenario, path: Path) -> None:
    """The plain calls layout: one JSON object per attempt."""
    with path.open("w") as fp:
        for a in sc.attempts:
            status = "pending" if a.end_ms is None else (a.error or "ok")
            rec = {"ts": a.iso(a.start_ms), "end": a.iso(a.end_ms), "tool": a.tool, "call_id": a.call_id,
                   "arguments": a.arguments(), "status": status}  # fmt: skip
            fp.write(json.dumps(rec) + "\n")


@pytest.mark.parametrize(
    ("writer", "fmt", "pending"),
    [
        (otlp_log, "otlp", False),
        (langsmith_log, "langsmith", True),
        (langfuse_log, "langfuse", True),
        (calls_log, "calls", True),
    ],  # fmt: skip
)
def test_assess_recovers_what_was_injected(writer: Any, fmt: str, pending: bool, tmp_path: Path) -> None:
    sc = scenario(pending=pending)
    log = tmp_path / f"{fmt}.jsonl"
    writer(sc, log)
    report = run(log)
    assert report["format"] == fmt
    assert report["bad_lines"]["count"] == 0
    check(report, sc)
    assert run(log, "--format", fmt)["rows"] == report["rows"]  # forcing the detected format: the same


def test_redacted_log_gives_the_same_rows_and_no_values(tmp_path: Path) -> None:
    sc = scenario(pending=True)
    log, out = tmp_path / "runs.jsonl", tmp_path / "runs.redacted.jsonl"
    langsmith_log(sc, log)
    report = run(log, "--redact", str(out))
    text = out.read_text()
    for secret in ("example.com", "A-17", "refund:A-3", "order B-2", "TimeoutError"):
        assert secret in log.read_text() and secret not in text
    again = run(out)
    # keys become digests, so whether a key carries time cannot be seen any more; every other row stays
    keep = {r["id"]: r for r in report["rows"] if r["id"] != "derived"}
    assert {r["id"]: r for r in again["rows"] if r["id"] != "derived"} == keep


def test_mcp_and_http_client_spans(tmp_path: Path) -> None:
    """MCP ``tools/call`` spans (the key in ``params._meta``) and HTTP client spans (the key in the
    ``Idempotency-Key`` request header attribute, the URL's query string never shown), from the SDK."""
    from google.protobuf.json_format import MessageToJson
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind

    log = tmp_path / "otlp.jsonl"

    class FileExporter(SpanExporter):
        def __init__(self) -> None:
            self.fp = log.open("w")

        def export(self, spans: Any) -> SpanExportResult:
            self.fp.write(MessageToJson(encode_spans(spans), indent=None) + "\n")
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            self.fp.close()

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    tracer = provider.get_tracer("client")
    t0 = 1_790_812_800_000_000_000
    for n, (order, key) in enumerate([("A-1", "refund:A-1"), ("A-1", "refund:A-1"), ("A-2", None), ("A-2", None)]):
        span = tracer.start_span("tools/call refund", kind=SpanKind.CLIENT, start_time=t0 + n * 10**9)
        span.set_attribute("mcp.method.name", "tools/call")
        span.set_attribute("gen_ai.tool.name", "refund")
        span.set_attribute("jsonrpc.request.id", str(n))
        span.set_attribute("mcp.request.params.arguments", json.dumps({"order": order}))
        if key:
            span.set_attribute("mcp.request.meta", json.dumps({"idempotencyKey": key}))
        span.end(end_time=t0 + n * 10**9 + 50_000_000)
    for n, status in enumerate([504, 200]):
        span = tracer.start_span("POST", kind=SpanKind.CLIENT, start_time=t0 + (10 + n) * 10**9)
        span.set_attribute("http.request.method", "POST")
        span.set_attribute("url.full", "https://pay.example/v1/charges?api_key=sk_live_QUERYSECRET")
        span.set_attribute("http.request.header.idempotency-key", ["ch-7"])
        span.set_attribute("http.response.status_code", status)
        span.end(end_time=t0 + (10 + n) * 10**9 + 100_000_000)
    provider.shutdown()
    report = run(log, "--writes", "refund,POST pay.example/v1/charges")
    rows = {r["id"]: (r["numerator"], r["denominator"]) for r in report["rows"]}
    assert rows["keyed"] == (4, 6)  # the two keyed MCP calls and both HTTP attempts
    assert rows["duplicates"] == (1, 5)  # A-2 twice without a key; A-1 twice with its key is not one
    assert rows["window"] == (1, 6) and rows["stable"] == (1, 1)  # the 504, retried with its key
    assert {t["tool"] for t in report["tools"]} == {"refund", "POST pay.example/v1/charges"}
    assert "QUERYSECRET" not in json.dumps(report)


def test_keys_appear_only_with_show_values(tmp_path: Path) -> None:
    sc = scenario()
    log = tmp_path / "calls.jsonl"
    calls_log(sc, log)
    hidden, shown = run(log), run(log, "--show-values")
    assert "tkt-" not in json.dumps(hidden)
    keys = [e["key"] for e in shown["examples"]["key carries time"]]
    assert len(keys) == 5 and all(k.startswith("tkt-") for k in keys)
    assert shown["rows"] == hidden["rows"]
