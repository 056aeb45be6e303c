"""OpenTelemetry spans of effects with the real OpenTelemetry SDK (``InMemorySpanExporter``): one
span per attempt with the effect key, target, operation and final state; the GenAI tool-call
attributes inside ``tool_call``; a span per reconciliation of the embedded runner; and nothing at
all (no tracer asked for) without a tracer provider or without the [otel] extra."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from effect_ledger.core.reconcile import Found, Target
from effect_ledger.errors import EffectUncertain
from effect_ledger.integrations._tools import tool_function
from effect_ledger.mcp.calls import WriteCalls
from effect_ledger.mcp.policy import Policy, WriteTool
from effect_ledger.metrics import tracing
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from effect_ledger.targets.ask import CallableReconciler
from tests.sdk_contract import Destination, FakeClock, run

EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process: set it on first use, keep it after.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def test_one_span_per_attempt_with_the_key_target_operation_and_state(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async def main() -> tuple[str, str]:
        async with await Ledger.open(str(tmp_path / "e.db"), clock=FakeClock(), targets=[Target("payments")]) as ledger:
            ok = await ledger.execute(
                target="payments", operation="refund.create", run_id="run-1", step="order-1001",
                request={"order": "1001"}, call=Destination(),
            )  # fmt: skip
            again = await ledger.execute(
                target="payments", operation="refund.create", run_id="run-1", step="order-1001",
                request={"order": "1001"}, call=Destination(),
            )  # fmt: skip
            assert not again.called  # the recorded receipt: no attempt, no span
            dest = Destination()
            dest.fail.append(TimeoutError())
            with pytest.raises(EffectUncertain) as lost:
                await ledger.execute(
                    target="payments", operation="refund.create", run_id="run-1", step="order-1002",
                    request={"order": "1002"}, call=dest,
                )  # fmt: skip
            return ok.effect_id, lost.value.effect_id

    ok_key, lost_key = run(main())
    got = spans.get_finished_spans()
    assert [s.name for s in got] == ["effect_ledger.attempt payments refund.create"] * 2
    first, second = got
    assert first.kind is SpanKind.CLIENT
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["effect_ledger.effect_id"] == ok_key
    assert first.attributes["effect_ledger.target"] == "payments"
    assert first.attributes["effect_ledger.operation"] == "refund.create"
    assert first.attributes["effect_ledger.attempt"] == 1
    assert first.attributes["effect_ledger.run_id"] == "run-1"
    assert first.attributes["effect_ledger.step"] == "order-1001"
    assert first.attributes["effect_ledger.state"] == "CONFIRMED"
    assert first.status.status_code is StatusCode.UNSET
    assert "gen_ai.operation.name" not in first.attributes  # not a tool call
    assert second.attributes["effect_ledger.effect_id"] == lost_key
    assert second.attributes["effect_ledger.state"] == "UNCERTAIN"
    assert second.status.status_code is StatusCode.ERROR
    assert second.attributes["error.type"] == "EffectUncertain"


def test_inside_a_tool_call_the_span_carries_the_genai_attributes(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    async def main() -> None:
        async with await Ledger.open(str(tmp_path / "e.db"), clock=FakeClock(), targets=[Target("payments")]) as ledger:
            with tracing.tool_call("refund_order", "call_abc123"):
                await ledger.execute(
                    target="payments", operation="refund.create", run_id="r", step="s", request={}, call=Destination()
                )

    run(main())
    (span,) = spans.get_finished_spans()
    assert span.name == "execute_tool refund_order"
    assert span.attributes is not None
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert span.attributes["gen_ai.tool.name"] == "refund_order"
    assert span.attributes["gen_ai.tool.call.id"] == "call_abc123"
    assert span.attributes["effect_ledger.state"] == "CONFIRMED"


def test_the_runners_reconciliation_has_its_span(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    clock = FakeClock()
    found = CallableReconciler(lambda view: Found("re_found", {"id": "re_found"}))
    target = Target("payments", reconciler=found)

    async def main() -> None:
        async with await Ledger.open(str(tmp_path / "e.db"), clock=clock, targets=[target]) as ledger:
            dest = Destination()
            dest.fail.append(ConnectionError("reset"))
            with pytest.raises(EffectUncertain):
                await ledger.execute(
                    target="payments", operation="refund.create", run_id="r", step="s", request={}, call=dest
                )
            clock.advance(3_600_000)
            await Runner(ledger).tick()

    run(main())
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["effect_ledger.attempt payments refund.create", "effect_ledger.reconcile payments refund.create"]
    rec = spans.get_finished_spans()[1]
    assert rec.kind is SpanKind.INTERNAL and rec.attributes is not None
    assert rec.attributes["effect_ledger.state"] == "CONFIRMED"


@pytest.mark.parametrize("missing", ["no provider", "no extra"])
def test_nothing_is_traced_without_a_provider_or_the_extra(tmp_path: Path, missing: str) -> None:
    """A fresh interpreter: the global provider of this one is set."""
    hide = "sys.modules['opentelemetry'] = None" if missing == "no extra" else ""
    code = textwrap.dedent(f"""
        import asyncio, sys
        {hide}
        from effect_ledger.core.reconcile import Target
        from effect_ledger.metrics import tracing
        from effect_ledger.sdk.ledger import Ledger

        async def main():
            async with await Ledger.open({str(tmp_path / "e.db")!r}, targets=[Target("p")]) as ledger:
                async def call(key):
                    return {{"id": "re_1"}}
                c = await ledger.execute(target="p", operation="o", run_id="r", step="s", request={{}}, call=call)
                assert c.called
        asyncio.run(main())
        assert tracing.tracer() is None
        print("untraced", tracing._api is False)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["untraced", "True" if missing == "no extra" else "False"]


class McpServer:
    """A fake MCP server (the destination): answers ``tools/call`` as a server does, once per call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def request(self, method: str, params: dict[str, Any], request_id: Any = None) -> dict[str, Any]:
        assert method == "tools/call"
        self.calls.append(params)
        return {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": "refunded"}]}}

    async def refuses_caller(self) -> str | None:
        return None


def test_an_mcp_proxy_write_is_a_genai_tool_call(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    policy = Policy(writes={"refund_order": WriteTool("refund_order", "payments", "refund.create")}, run_id="run-7")
    server = McpServer()

    async def main() -> dict[str, Any]:
        async with await Ledger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:
            calls = WriteCalls(ledger, policy)
            msg = {
                "jsonrpc": "2.0", "id": 42, "method": "tools/call",
                "params": {"name": "refund_order", "arguments": {"order": "1001"}, "_meta": {"step": "order-1001"}},
            }  # fmt: skip
            assert calls.is_write_call(msg)
            return await calls.handle(msg, server, "session-1")

    answer = run(main())
    assert "result" in answer and len(server.calls) == 1
    (span,) = spans.get_finished_spans()
    assert span.name == "execute_tool refund_order"
    assert span.attributes is not None
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert span.attributes["gen_ai.tool.name"] == "refund_order"
    assert span.attributes["gen_ai.tool.call.id"] == "42"
    assert span.attributes["effect_ledger.target"] == "payments"
    assert span.attributes["effect_ledger.state"] == "CONFIRMED"


@dataclass
class ToolContext:
    """What the OpenAI Agents SDK's ToolContext and Pydantic AI's RunContext both carry."""

    tool_call_id: str


def refund(order: str, *, idempotency_key: str) -> dict[str, str]:
    return {"id": f"re_{order}", "key": idempotency_key}


def test_an_agent_frameworks_tool_is_a_genai_tool_call(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """The tool function the OpenAI Agents SDK and Pydantic AI adapters hand their framework."""

    async def main() -> Any:
        async with await Ledger.open(str(tmp_path / "e.db"), targets=[Target("payments")]) as ledger:

            async def run_it(op: str, request: Any, call: Any, effect_ledger_context: Any) -> Any:
                return await ledger.execute(
                    target="payments", operation=op, request=request, call=call, run_id="r", step="order-1001"
                )

            tool = tool_function(
                refund, name="refund_order", operation="refund.create", key_arg="idempotency_key",
                context_type=ToolContext, run=run_it,
            )  # fmt: skip
            return await tool(ToolContext("call_9"), "1001")

    assert run(main()).receipt_id == "re_1001"
    (span,) = spans.get_finished_spans()
    assert span.name == "execute_tool refund_order"
    assert span.attributes is not None
    assert span.attributes["gen_ai.tool.call.id"] == "call_9"
    assert span.attributes["gen_ai.tool.name"] == "refund_order"
    assert span.attributes["effect_ledger.operation"] == "refund.create"


@pytest.mark.parametrize("how", ["named in the environment", "set after the first effect"])
def test_a_provider_set_by_the_environment_or_later_is_used(tmp_path: Path, how: str) -> None:
    """A fresh interpreter: ``tracer()`` reads OTel's global rather than asking
    ``get_tracer_provider()`` per span, so both ways OTel knows of a provider must still reach it."""
    env = {**os.environ, "OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}
    if how != "named in the environment":
        env.pop("OTEL_PYTHON_TRACER_PROVIDER")
    code = textwrap.dedent(f"""
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from effect_ledger.core.reconcile import Target
        from effect_ledger.metrics import tracing
        from effect_ledger.sdk.ledger import Ledger

        async def main():
            async with await Ledger.open({str(tmp_path / "e.db")!r}, targets=[Target("p")]) as ledger:
                async def call(key):
                    return {{"id": "re_1"}}
                await ledger.execute(target="p", operation="o", run_id="r", step="s1", request={{}}, call=call)
                print("first", tracing.tracer() is not None)
                if {how!r} == "set after the first effect":
                    trace.set_tracer_provider(TracerProvider())
                print("then", tracing.tracer() is not None)
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    first = "True" if how == "named in the environment" else "False"
    assert out.stdout.split() == ["first", first, "then", "True"]
