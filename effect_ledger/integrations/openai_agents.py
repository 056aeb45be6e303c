"""OpenAI Agents SDK: function tools that write to the outside world once per run, escalations as the
SDK's own tool approvals.

    from agents import Agent, Runner
    from effect_ledger import Ledger
    from effect_ledger.openai_agents import ledger_tool

    ledger = await Ledger.open("effects.db", targets="targets.toml")

    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict:
        return gateway.refund(order, amount, idempotency_key=idempotency_key)

    agent = Agent(name="support", tools=[refund])          # refund is a FunctionTool
    await Runner.run(agent, "refund order 123", context={"run_id": "conv-42"})

The key rule (NEVER CHANGE IT: keys are stored in ledgers and handed to destinations; a different rule
turns a resumed conversation into a second refund)::

    run_id = the run context's run_id (context={"run_id": ...} or an object with .run_id): your
             conversation or run id, the one you give your Session
    step   = the decorator's step= (a name, or a function of the call's arguments), else the tool's name
    key    = effect_key(target, operation, run_id, step, ledger namespace)

The model's ``tool_call_id`` is left out on purpose: the SDK gets a new one every time the model asks
again (a rerun after a crash, a retried turn), and a key made from it would make a second refund.
So within one run a tool makes one ``operation`` once: the same request again returns the recorded
receipt (the tool tells the model the destination's own receipt); another request raises
``EffectConflict``. A tool the model may call for several orders in one run names each write with
``step=lambda args: f"order-{args['order']}"``.

An effect that needs a person (ESCALATED: nobody can tell whether it happened) stops the run through
the SDK's approval mechanism: the tool's ``needs_approval`` asks the ledger before the tool runs
(``Ledger.settle``: an earlier attempt is asked about first, as ``execute`` would), so the run returns
with ``result.interruptions``. Show the
person ``await escalation(refund, item, context)``; record their answer and resume::

    state = result.to_state()                            # or RunState.from_json(...) later
    await decide(refund, state, item, {"decision": "confirmed" | "absent" | "abandon",
                                       "by": "alice", "reason": "...", "receipt_id": "re_1"}, context)
    result = await Runner.run(agent, state)

The decision is recorded in the ledger first (``effect_ledger.integrations.decisions``), then
confirmed and absent approve the call (confirmed: the tool returns the recorded receipt without
calling; absent: it executes again with the same key) and abandon rejects it (the model is told it
was not done). Other ledger errors (``EffectUncertain`` in UNCERTAIN, ``EffectInProgress``,
``EffectConflict``) stop the run: ``Runner.run`` raises the SDK's ``UserError`` with the ledger's
error as its ``__cause__``; nothing is sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState, ToolApprovalItem, function_tool
from agents.tool_context import ToolContext

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import State
from effect_ledger.errors import InvalidEffect
from effect_ledger.integrations._tools import (
    CONTEXT,
    Step,
    arguments,
    record_decision,
    step_of,
    tool_function,
    tool_output,
)
from effect_ledger.integrations.decisions import escalation as shown_to_a_person
from effect_ledger.sdk.ledger import Ledger


@dataclass(frozen=True)
class _Spec:
    ledger: Ledger
    fn: Callable[..., Any]
    target: str
    operation: str
    name: str
    step: Step
    key_arg: str

    def ids(self, context: Any, request: Mapping[str, Any]) -> tuple[str, str]:
        return run_identity(context), step_of(self.step, self.name, request)

    def key(self, context: Any, request: Mapping[str, Any]) -> str:
        return effect_key(self.target, self.operation, *self.ids(context, request), self.ledger.namespace)


def run_identity(context: Any) -> str:
    """The run id of the key rule: ``context["run_id"]`` or ``context.run_id`` of the run context
    (what ``Runner.run(..., context=...)`` was given); ``InvalidEffect`` without one."""
    value = context.get("run_id") if isinstance(context, Mapping) else getattr(context, "run_id", None)
    if not isinstance(value, str) or not value:
        raise InvalidEffect(
            "effect_ledger.openai_agents keys writes by the run: give Runner.run a context with a run_id "
            "(context={'run_id': conversation_id} or an object with .run_id)"
        )
    return value


def ledger_tool(
    ledger: Ledger,
    *,
    target: str,
    operation: str | None = None,
    step: Step = None,
    timeout: float | None = None,
    key_arg: str = "idempotency_key",
    name: str | None = None,
    **tool_options: Any,
) -> Callable[[Callable[..., Any]], FunctionTool]:
    """Turn the function that makes one external write into a ``FunctionTool``. It receives the
    idempotency key as the keyword ``key_arg`` (hidden from the model); its other parameters are the
    tool's and form the request. ``operation`` defaults to the function's name with ``_`` as ``.``;
    ``name`` (the tool's name, the default step) to the function's name; ``tool_options`` go to
    ``agents.function_tool`` (not ``needs_approval``: the ledger decides when a person must).
    Errors are raised out of the run (``failure_error_function=None``), never shown to the model as
    text it could answer by calling again, unless ``tool_options`` say otherwise."""
    if "needs_approval" in tool_options:
        raise InvalidEffect("a ledger tool asks for approval when its effect needs a person; drop needs_approval")

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        spec = _Spec(ledger, fn, target, operation or fn.__name__.replace("_", "."), name or fn.__name__, step, key_arg)

        async def run(op: str, request: Any, call: Callable[[str], Any], **own: Any) -> Any:
            ctx: ToolContext[Any] = own[CONTEXT]
            run_id, step_name = spec.ids(ctx.context, request)
            c = await ledger.execute(
                target=target, operation=op, request=request, call=call, run_id=run_id, step=step_name, timeout=timeout
            )
            return tool_output(c)

        async def needs_a_person(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
            # The SDK asks before the tool runs, and only then can a run stop for approval: so an
            # earlier attempt is settled here (asked about, as execute would), not in the tool.
            request = arguments(fn, key_arg, params)
            run_id, step_name = spec.ids(ctx.context, request)
            effect = await ledger.settle(
                target=target,
                operation=spec.operation,
                request=request,
                call=lambda k: fn(**request, **{key_arg: k}),
                run_id=run_id,
                step=step_name,
                timeout=timeout,
            )
            return effect is not None and effect.state is State.ESCALATED

        func = tool_function(
            fn, name=spec.name, operation=spec.operation, key_arg=key_arg, context_type=ToolContext, run=run
        )
        options: dict[str, Any] = {"failure_error_function": None, **tool_options}
        tool = function_tool(func, needs_approval=needs_a_person, **options)
        tool.effect_ledger = spec  # type: ignore[attr-defined]  # read by escalation() and decide()
        return tool

    return wrap


def _spec_and_key(tool: FunctionTool, item: ToolApprovalItem, context: Any) -> tuple[_Spec, str]:
    spec = getattr(tool, "effect_ledger", None)
    if not isinstance(spec, _Spec):
        raise InvalidEffect(f"tool {tool.name!r} was not made by effect_ledger.openai_agents.ledger_tool")
    if item.tool_name != tool.name:
        raise InvalidEffect(f"the approval is for tool {item.tool_name!r}, not {tool.name!r}")
    raw = getattr(item.raw_item, "arguments", None)
    if raw is None and isinstance(item.raw_item, Mapping):
        raw = item.raw_item.get("arguments")
    args = json.loads(raw or "{}")
    return spec, spec.key(context, arguments(spec.fn, spec.key_arg, args))


async def escalation(tool: FunctionTool, item: ToolApprovalItem, context: Any) -> dict[str, Any] | None:
    """What a person is shown about an interruption of a ledger tool (``result.interruptions``): the
    escalated effect (see ``effect_ledger.integrations.decisions.escalation``), or None when the
    effect is no longer escalated."""
    spec, key = _spec_and_key(tool, item, context)
    effect = await spec.ledger.get(key)
    if effect is None or effect.state is not State.ESCALATED:
        return None
    return shown_to_a_person(effect, effect.reason or "escalated")


async def decide(tool: FunctionTool, state: RunState[Any], item: ToolApprovalItem, answer: Any, context: Any) -> None:
    """Record a person's answer on the escalated effect behind ``item``, then approve the call
    (confirmed, absent) or reject it (abandon) in ``state``; resume with ``Runner.run(agent, state)``."""
    spec, key = _spec_and_key(tool, item, context)
    decision = await record_decision(spec.ledger, key, answer)
    if decision == "abandon":
        state.reject(item, rejection_message=f"not done: a person abandoned it ({answer['reason']})")
    else:
        state.approve(item)


__all__ = ["ledger_tool", "run_identity", "escalation", "decide"]
