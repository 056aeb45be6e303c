"""Pydantic AI: tools that write to the outside world once per conversation, escalations as deferred
tool calls that a person approves.

    from pydantic_ai import Agent, DeferredToolRequests
    from effect_ledger import Ledger
    from effect_ledger.pydantic_ai import ledger_tool

    ledger = await Ledger.open("effects.db", targets="targets.toml")

    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict:
        return gateway.refund(order, amount, idempotency_key=idempotency_key)

    agent = Agent(model, tools=[refund], output_type=[str, DeferredToolRequests])   # refund is a Tool
    await agent.run("refund order 123", conversation_id="conv-42")

The key rule (NEVER CHANGE IT: keys are stored in ledgers and handed to destinations; a different rule
turns a resumed conversation into a second refund)::

    run_id = RunContext.conversation_id: the conversation_id given to the run, else the one on the
             message_history it continues (Pydantic AI keeps it on every message), else a fresh one
    step   = the decorator's step= (a name, or a function of the call's arguments), else the tool's name
    key    = effect_key(target, operation, run_id, step, ledger namespace)

``RunContext.run_id`` (new for every ``agent.run`` unless a durable engine derives it), the model's
``tool_call_id`` (new every time the model asks again, as it does after a run was cut off) and
``run_step`` are left out on purpose. So within one conversation a tool makes one ``operation``
once: the same request again returns the recorded receipt (the tool returns the destination's own
receipt); another request raises ``EffectConflict``. A tool the model may call for several orders
names each write with ``step=lambda args: f"order-{args['order']}"``. Continue a conversation from
its saved messages (or give its ``conversation_id``) and its writes keep their keys.

An effect that needs a person (ESCALATED: nobody can tell whether it happened) becomes Pydantic AI's
``ApprovalRequired``: the run ends with a ``DeferredToolRequests`` output (give the agent an
``output_type`` that includes it) whose ``metadata[tool_call_id]`` is the escalated effect (see
``effect_ledger.integrations.decisions.escalation``). Record the person's answer and resume::

    results = await decide(ledger, result.output, {tool_call_id: {"decision": "confirmed" | "absent"
                           | "abandon", "by": "alice", "reason": "...", "receipt_id": "re_1"}})
    await agent.run(message_history=result.all_messages(), deferred_tool_results=results)

The decision is recorded in the ledger first; confirmed and absent approve the call (confirmed: the
tool returns the recorded receipt without calling; absent: it executes again with the same key),
abandon denies it (the model is told it was not done). Other ledger errors (``EffectUncertain`` in
UNCERTAIN, ``EffectInProgress``) are raised out of the run: it holds and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic_ai import (
    ApprovalRequired,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
    ToolApproved,
    ToolDenied,
)

from effect_ledger.core.model import State
from effect_ledger.errors import EffectUncertain, InvalidEffect
from effect_ledger.integrations._tools import CONTEXT, Step, record_decision, step_of, tool_function, tool_output
from effect_ledger.integrations.decisions import escalation
from effect_ledger.sdk.ledger import Ledger


def run_identity(ctx: RunContext[Any]) -> str:
    """The run id of the key rule: the run's ``conversation_id``."""
    if not ctx.conversation_id:
        raise InvalidEffect("effect_ledger.pydantic_ai keys writes by the conversation, and this run has none")
    return ctx.conversation_id


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
) -> Callable[[Callable[..., Any]], Tool[Any]]:
    """Turn the function that makes one external write into a ``Tool``. It receives the idempotency
    key as the keyword ``key_arg`` (hidden from the model); its other parameters are the tool's and
    form the request. ``operation`` defaults to the function's name with ``_`` as ``.``; ``name``
    (the tool's name, the default step) to the function's name; ``tool_options`` go to ``Tool``."""

    def wrap(fn: Callable[..., Any]) -> Tool[Any]:
        tool_name = name or fn.__name__

        async def run(op: str, request: Any, call: Callable[[str], Any], **own: Any) -> Any:
            ctx: RunContext[Any] = own[CONTEXT]
            run_id, step_name = run_identity(ctx), step_of(step, tool_name, request)
            try:
                c = await ledger.execute(
                    target=target,
                    operation=op,
                    request=request,
                    call=call,
                    run_id=run_id,
                    step=step_name,
                    timeout=timeout,
                )
            except EffectUncertain as e:
                # Approved means a person answered (decide() recorded it): if the effect is still
                # escalated, the answer was not recorded, and asking again would loop.
                if e.state != State.ESCALATED.value or ctx.tool_call_approved:
                    raise
                effect = await ledger.get(e.effect_id)
                if effect is None:  # cannot happen: an escalated effect is recorded; say so rather than guess
                    raise
                raise ApprovalRequired(metadata=escalation(effect, e.reason)) from e
            return tool_output(c)

        func = tool_function(fn, name=tool_name, operation=operation, key_arg=key_arg, context_type=RunContext, run=run)
        return Tool(func, takes_ctx=True, name=tool_name, **tool_options)

    return wrap


async def decide(ledger: Ledger, requests: DeferredToolRequests, answers: Mapping[str, Any]) -> DeferredToolResults:
    """Record each person's answer (by ``tool_call_id``) on the escalated effect of that deferred
    call; the results approve the call (confirmed, absent) or deny it (abandon). Resume the run with
    ``deferred_tool_results=`` these and the run's messages."""
    results = DeferredToolResults()
    for call in requests.approvals:
        if call.tool_call_id not in answers:
            continue
        asked = requests.metadata.get(call.tool_call_id) or {}
        if asked.get("effect_ledger") != "escalated":
            raise InvalidEffect(f"deferred call {call.tool_call_id} ({call.tool_name}) is not an escalated effect")
        answer = answers[call.tool_call_id]
        decision = await record_decision(ledger, asked["effect_id"], answer)
        results.answered_by[call.tool_call_id] = answer["by"]
        results.approvals[call.tool_call_id] = (
            ToolDenied(f"not done: a person abandoned it ({answer['reason']})")
            if decision == "abandon"
            else ToolApproved()
        )
    unknown = set(answers) - set(results.approvals)
    if unknown:
        raise InvalidEffect(f"no deferred call waits for an answer with id {', '.join(sorted(unknown))}")
    return results


__all__ = ["ledger_tool", "run_identity", "decide"]
