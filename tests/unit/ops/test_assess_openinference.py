"""``effects assess`` on OpenInference TOOL spans: a real LangGraph agent (a fake chat model that asks
for scripted tool calls) instrumented by OpenInference's LangChain instrumentation, its spans exported
by the OpenTelemetry SDK and encoded by its OTLP encoder, one export batch per line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from effect_ledger.cli.main import main


def test_openinference_tool_spans_from_a_langgraph_agent(tmp_path: Path) -> None:
    from google.protobuf.json_format import MessageToJson
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    log = tmp_path / "otlp.jsonl"

    class FileExporter(SpanExporter):
        def __init__(self) -> None:
            self.fp = log.open("w")

        def export(self, spans: Any) -> SpanExportResult:
            self.fp.write(MessageToJson(encode_spans(spans), indent=None) + "\n")
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            self.fp.close()

    class Fake(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

    failed: set[str] = set()

    @tool
    def refund(order: str, amount: int, idempotency_key: str) -> str:
        """Refund an order."""
        return "refunded"

    @tool
    def send_email(to: str, template: str) -> str:
        """Send an email; the first one to slow@example.com times out."""
        if to.startswith("slow") and to not in failed:
            failed.add(to)
            raise TimeoutError("timed out")
        return "sent"

    # what the model asks for, run by run: a refund made twice with its key (the destination answers
    # the second from its record), an email sent twice (a duplicate), an email that times out and is sent again
    plan = [
        ("refund", {"order": "A-1", "amount": 5, "idempotency_key": "refund:A-1"}),
        ("refund", {"order": "A-1", "amount": 5, "idempotency_key": "refund:A-1"}),
        ("send_email", {"to": "a@example.com", "template": "receipt"}),
        ("send_email", {"to": "a@example.com", "template": "receipt"}),
        ("send_email", {"to": "slow@example.com", "template": "receipt"}),
        ("send_email", {"to": "slow@example.com", "template": "receipt"}),
    ]
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(FileExporter()))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        for n, (name, args) in enumerate(plan):
            call = AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{n}"}])
            model = Fake(messages=iter([call, AIMessage("done")]))
            graph = StateGraph(MessagesState)
            graph.add_node("agent", lambda s, m=model: {"messages": [m.invoke(s["messages"])]})
            graph.add_node("tools", ToolNode([refund, send_email], handle_tool_errors=True))
            graph.add_edge(START, "agent")
            graph.add_conditional_edges("agent", tools_condition, ["tools", END])
            graph.add_edge("tools", "agent")
            graph.compile().invoke({"messages": [("user", "go")]})
    finally:
        instrumentor.uninstrument()
        provider.shutdown()

    r = CliRunner().invoke(main, ["assess", str(log), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["format"] == "otlp" and report["records_not_tool_calls"] > 0  # graph and model spans
    rows = {x["id"]: (x["numerator"], x["denominator"], x["verdict"]) for x in report["rows"]}
    assert rows["keyed"] == (2, 6, "fix first")
    assert rows["duplicates"] == (1, 5, "fail")  # a@example.com twice; the keyed refund is not one
    assert rows["window"][:2] == (1, 6)  # the timeout: the caller never learned what happened
    assert rows["stable"] == (0, 0, "no data")  # the retried email carried no key
    rhythm = next(x for x in report["rows"] if x["id"] == "rhythm")
    assert rhythm["denominator"] == 1
    assert {t["tool"]: t["writes"] for t in report["tools"]} == {"refund": 2, "send_email": 4}
