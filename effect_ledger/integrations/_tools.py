"""What the agent-framework adapters (OpenAI Agents SDK, Pydantic AI) share: a write function turned
into a tool function on ``sdk._wrap.keyed``, the step rule of a tool, and a person's answer recorded.

A framework builds a tool's JSON schema from the function's signature and type hints, and hands the
tool its run context as the first argument. The tool function made here shows the framework that
signature (the context first, then the write function's own parameters without the idempotency key,
which the model must never see or choose), and passes the context to ``run`` as a keyword of the
wrapper's own.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from effect_ledger.core.model import State
from effect_ledger.errors import InvalidEffect
from effect_ledger.integrations.decisions import parse_decision
from effect_ledger.metrics import tracing
from effect_ledger.sdk._wrap import bind_request, keyed
from effect_ledger.sdk.ledger import Confirmation, Ledger

#: The wrapper's own keyword that carries the framework's run context to ``run``.
CONTEXT = "effect_ledger_context"
#: ``step=`` of a tool: a fixed name, or a function of the tool call's arguments (by name).
Step = str | Callable[[Mapping[str, Any]], str] | None


def tool_function(
    fn: Callable[..., Any],
    *,
    name: str,
    operation: str | None,
    key_arg: str,
    context_type: Any,
    run: Callable[..., Awaitable[Any]],
) -> Callable[..., Awaitable[Any]]:
    """``fn`` as an async tool function ``(ctx: context_type, <fn's parameters but key_arg>)``;
    ``run(op, request, call, effect_ledger_context=ctx)`` makes the write."""
    inner = keyed(fn, operation, key_arg, {CONTEXT: None}, run)
    sig = inspect.signature(fn)
    if "ctx" in sig.parameters:
        raise InvalidEffect(f"{fn.__name__}: the tool's context is passed as 'ctx'; rename that parameter")
    # Resolved here, in fn's own module: the framework resolves string annotations in the module that
    # defines the function it is given, which is this one.
    hints = typing.get_type_hints(fn, include_extras=True)
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values() if p.name != key_arg
    ]
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=context_type)

    @functools.wraps(fn)
    async def tool(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        # The attempt's span is this tool call's (GenAI attributes); the model's id of the call is
        # ``tool_call_id`` on the OpenAI Agents SDK's ToolContext and on Pydantic AI's RunContext.
        call_id = getattr(ctx, "tool_call_id", None)
        with tracing.tool_call(name, call_id if isinstance(call_id, str) else None):
            return await inner(*args, **kwargs, **{CONTEXT: ctx})

    del tool.__wrapped__  # the framework must see the signature below, not fn's (it has the key)
    tool.__signature__ = sig.replace(parameters=[ctx, *params], return_annotation=Any)  # type: ignore[attr-defined]
    tool.__annotations__ = {"ctx": context_type, **{p.name: p.annotation for p in params}, "return": Any}
    tool.__name__ = name
    return tool


def step_of(step: Step, tool_name: str, request: Mapping[str, Any]) -> str:
    """The step of a tool's write: ``step`` (or ``step(arguments)``), else the tool's name."""
    if step is None:
        return tool_name
    name = step(request) if callable(step) else step
    if not isinstance(name, str) or not name:
        raise InvalidEffect(f"step= of tool {tool_name!r} gave {name!r}; it must give a non-empty string")
    return name


def arguments(fn: Callable[..., Any], key_arg: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The request a tool call with these arguments (by name) makes: as the wrapper binds it."""
    return bind_request(inspect.signature(fn), key_arg, (), dict(args))


def tool_output(c: Confirmation) -> Any:
    """What the model is told: the destination's own receipt, or (when a person confirmed it and the
    ledger has no value) the receipt id they gave."""
    return c.value if c.value is not None else {"receipt_id": c.receipt_id, "confirmed_by": "a person"}


async def record_decision(ledger: Ledger, key: str, answer: Any) -> str:
    """Record a person's answer (see ``effect_ledger.integrations.decisions``) on the escalated effect
    ``key``; returns the decision ("confirmed", "absent" or "abandon"). Recorded only while the effect
    is still ESCALATED, so an answer handed over twice records nothing twice."""
    decision = parse_decision(answer)
    if decision.effect_id is not None and decision.effect_id != key:
        raise InvalidEffect(f"the answer is about effect {decision.effect_id}, but {key} is escalated")
    effect = await ledger.get(key)
    if effect is not None and effect.state is State.ESCALATED:
        await ledger.decide(key, decision.kind, by=decision.by, reason=decision.reason, receipt_id=decision.receipt_id)
    return str(answer["decision"]).lower()


__all__ = ["CONTEXT", "Step", "tool_function", "step_of", "arguments", "tool_output", "record_decision"]
