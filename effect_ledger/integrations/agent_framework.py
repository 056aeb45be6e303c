"""Microsoft Agent Framework: external writes in function tools, keyed by the run, escalations as
approval requests (``request_info`` in a workflow).

    from agent_framework import Agent, WorkflowBuilder
    from effect_ledger import SyncLedger
    from effect_ledger.agent_framework import ledger_tool

    ledger = SyncLedger.open("effects.db", targets="targets.toml")

    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict:
        "Refund an order (amount in cents)."
        return gateway.refund(order, amount, idempotency_key=idempotency_key)

    agent = Agent(client=..., name="refunds", tools=[refund])
    workflow = WorkflowBuilder(start_executor=agent, checkpoint_storage=storage).build()
    await workflow.run("refund order 123", function_invocation_kwargs={"run_id": "order-123"})
    # after a crash, from its last checkpoint, with the same run id:
    await workflow.run(checkpoint_id=cp.checkpoint_id, function_invocation_kwargs={"run_id": "order-123"})

``ledger_tool`` returns an Agent Framework ``FunctionTool`` (``agent_framework.tool``) whose arguments,
as the model sees them, are the function's without the key; it returns the destination's receipt.

The key rule (NEVER CHANGE IT: keys are stored in ledgers and handed to destinations; a different rule
turns a replayed superstep into a second refund)::

    run_id = function_invocation_kwargs["run_id"], given to workflow.run / agent.run (the tools see it
             as FunctionInvocationContext.kwargs); give the same one when the run goes on from a
             checkpoint or with responses
    step   = the decorator's step= (a string, or a function of the request, e.g. one key per order),
             else the tool's name
    key    = effect_key(target, operation, run_id, step, ledger namespace)

Nothing in it changes when a superstep is replayed from a checkpoint (in this process or another),
when the agent's function loop calls the tool again, or when an approved call is replayed after an
approval pause: the model's ``call_id``, checkpoint ids, superstep numbers and the session are left
out on purpose (the model mints a new ``call_id`` every time it asks). So within one run a tool writes
one ``operation`` once: the same request again returns the recorded receipt, a different one is
refused (``EffectConflict``); a tool that makes several writes of one operation in a run names each
with ``step=lambda request: f"order-{request['order']}"``.

An effect that needs a person (``EffectUncertain`` in state ESCALATED) becomes Agent Framework's own
approval request: the tool raises ``UserInputRequiredException`` with a ``function_approval_request``
whose ``additional_properties["effect_ledger"]`` is the dict of ``decisions.escalation``. An agent
returns it in ``user_input_requests``; a workflow's agent executor emits it as a ``request_info`` event
and waits (checkpointed). ``answer(ledger, request, decision)`` records the person's decision
(``decisions`` shape) and returns the response to send (``workflow.run(responses={request_id:
...})``): confirmed or absent -> approved, the call is replayed and returns the recorded receipt
(confirmed) or is made again with the same key (absent); abandon -> rejected, the model is told so.
Any other error of the ledger (uncertain, in progress, closed, conflict, no run id) stops the agent's
run fail-closed (``MiddlewareFailure``, caused by the ledger's error): Agent Framework would otherwise
hand an exception to the model as a tool error and let it call again.

Writes made by workflow executors themselves (no model in between): ``ledger_step`` decorates the
write; call it awaited in a handler with the handler's context, ``await refund(order, amount, ctx=ctx)``.
Its key rule (NEVER CHANGE IT either)::

    run_id = the workflow state's RUN_STATE ("effect_ledger.run_id"): set it with set_run(ctx, run_id)
             in the start executor; the state is checkpointed, so a replayed superstep reads the same
    step   = the step= given to the call, else the decorator's step=, else the function's name
    key    = effect_key(target, operation, run_id, step, ledger namespace)

(The executor's id is not readable from its context, and superstep numbers change on replay.) It
returns the ``Confirmation`` and raises the ledger's errors; for an escalation, ``await
ask_person(ledger, ctx, e)`` sends Agent Framework's ``request_info`` (the escalation dict) and the
executor's ``@response_handler`` (``original_request: dict, response: dict``) calls ``record(ledger,
original_request, response)`` and makes the call again.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from agent_framework import Content, FunctionInvocationContext, MiddlewareFailure, WorkflowContext, tool
from agent_framework.exceptions import UserInputRequiredException

from effect_ledger.core.model import DecisionKind, State
from effect_ledger.errors import EffectUncertain, InvalidEffect, LedgerError
from effect_ledger.integrations.decisions import PersonDecision, escalation, parse_decision
from effect_ledger.sdk._wrap import keyed
from effect_ledger.sdk.receipts import Confirmation
from effect_ledger.sdk.sync import SyncLedger

RUN_ID = "run_id"  # the key of function_invocation_kwargs that carries the run id
RUN_STATE = "effect_ledger.run_id"  # the key of the workflow state that carries it for executors
ESCALATION = "effect_ledger"  # the key of the approval request's additional_properties
_CTX = "effect_ledger_ctx"  # the parameter through which Agent Framework hands the tool its context


def run_identity(context: FunctionInvocationContext | None, tool_name: str, step: str | None = None) -> tuple[str, str]:
    """``(run_id, step)`` of a write the tool ``tool_name`` makes now, by the key rule."""
    run_id = (context.kwargs if context is not None else {}).get(RUN_ID)
    if not isinstance(run_id, str) or not run_id:
        raise InvalidEffect(
            f"tool {tool_name!r} runs without a run id: pass function_invocation_kwargs={{'run_id': ...}} "
            "to workflow.run / agent.run (the key is built from it)"
        )
    return run_id, step or tool_name


def _approval_request(ledger: SyncLedger, e: EffectUncertain, tool_name: str, request: dict[str, Any]) -> Content:
    """The escalation as Agent Framework's approval request for this tool call. Its id is the effect
    and attempt: the same escalation asked again is the same request."""
    effect = ledger.get(e.effect_id)
    if effect is None:  # cannot happen: an escalated effect is recorded; say so rather than guess
        raise e
    rid = f"{e.effect_id}#{effect.attempt}"
    call = Content.from_function_call(call_id=rid, name=tool_name, arguments=request, id=rid)
    return Content.from_function_approval_request(
        id=rid, function_call=call, additional_properties={ESCALATION: escalation(effect, e.reason)}
    )


def ledger_tool(
    ledger: SyncLedger,
    *,
    target: str,
    operation: str | None = None,
    name: str | None = None,
    step: str | Callable[[dict[str, Any]], str] | None = None,
    timeout: float | None = None,
    key_arg: str = "idempotency_key",
) -> Callable[[Callable[..., Any]], Any]:
    """Decorate the function that makes one external write: the result is an Agent Framework
    ``FunctionTool`` (``name`` defaults to the function's). The function receives the idempotency key
    as the keyword ``key_arg``; its other arguments form the request; its docstring describes it."""

    def wrap(fn: Callable[..., Any]) -> Any:
        tool_name = name or fn.__name__

        def run(op: str, request: dict[str, Any], call: Callable[[str], Any], **own: Any) -> dict[str, Any]:
            try:
                run_id, step_name = run_identity(own[_CTX], tool_name, step(request) if callable(step) else step)
                c = ledger.execute(
                    target=target,
                    operation=op,
                    request=request,
                    call=call,
                    run_id=run_id,
                    step=step_name,
                    timeout=timeout,
                )
            except EffectUncertain as e:
                if e.state != State.ESCALATED.value:
                    raise MiddlewareFailure(str(e)) from e
                raise UserInputRequiredException([_approval_request(ledger, e, tool_name, request)], str(e)) from e
            except LedgerError as e:
                raise MiddlewareFailure(str(e)) from e
            # The destination's own receipt id, and its answer when it gave one (the recorded one on a
            # replay: the model sees the same thing whether or not the write was made just now).
            return {"receipt_id": c.receipt_id, "effect_id": c.effect_id, "result": c.value}

        wrapper = keyed(fn, operation, key_arg, {_CTX: None}, run)
        # The model sees the arguments without the key; Agent Framework injects its context into the
        # parameter annotated FunctionInvocationContext (and leaves it out of the tool's schema).
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != key_arg]
        ctx = inspect.Parameter(
            _CTX, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=FunctionInvocationContext
        )
        wrapper.__signature__ = sig.replace(parameters=[*params, ctx])  # type: ignore[attr-defined]
        del wrapper.__wrapped__  # type: ignore[attr-defined]
        wrapper.__annotations__ = {
            **{k: v for k, v in wrapper.__annotations__.items() if k != key_arg},
            _CTX: FunctionInvocationContext,
        }
        return tool(name=tool_name)(wrapper)

    return wrap


def escalation_of(request: Any) -> dict[str, Any] | None:
    """The escalation an approval request (a ``request_info`` event's data) carries, if it is one."""
    props = getattr(request, "additional_properties", None)
    asked = props.get(ESCALATION) if isinstance(props, Mapping) else None
    return dict(asked) if isinstance(asked, Mapping) else None


def record(ledger: SyncLedger, asked: Mapping[str, Any], decision: Any) -> PersonDecision:
    """Record a person's decision (``decisions`` shape) on the escalation ``asked`` (the dict of
    ``decisions.escalation``) while the effect is still ESCALATED: an answer handed back again (a
    response replayed from a checkpoint) is not recorded twice."""
    d = parse_decision(decision)
    key = str(asked["effect_id"])
    if d.effect_id is not None and d.effect_id != key:
        raise InvalidEffect(f"the decision answers effect {d.effect_id}, but {key} is escalated")
    now = ledger.get(key)
    if now is not None and now.state is State.ESCALATED:
        # An answer about an earlier attempt never decides a later escalation of the same effect.
        if asked.get("attempt") not in (None, now.attempt):
            raise InvalidEffect(
                f"this answer is about attempt {asked['attempt']} of {key}, which is escalated again at "
                f"attempt {now.attempt}: answer the new request"
            )
        ledger.decide(key, d.kind, by=d.by, reason=d.reason, receipt_id=d.receipt_id)
    return d


def answer(ledger: SyncLedger, request: Content, decision: Any) -> Content:
    """Record a person's decision on the escalation an approval request carries and return the
    approval response to send back (approved unless the decision is abandon)."""
    asked = escalation_of(request)
    if asked is None:
        raise InvalidEffect("this request is not an effect-ledger escalation")
    d = record(ledger, asked, decision)
    return request.to_function_approval_response(approved=d.kind is not DecisionKind.ABANDONED)


def set_run(ctx: WorkflowContext[Any, Any], run_id: str) -> None:
    """Name the workflow's run for ``ledger_step`` keys (in the workflow state, so it is checkpointed)."""
    if not run_id:
        raise InvalidEffect("set_run needs a run id")
    ctx.set_state(RUN_STATE, run_id)


def ledger_step(
    ledger: SyncLedger,
    *,
    target: str,
    operation: str | None = None,
    step: str | None = None,
    timeout: float | None = None,
    key_arg: str = "idempotency_key",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate the function that makes one external write from a workflow executor. The wrapper is
    async and takes ``ctx=`` (the handler's ``WorkflowContext``) and ``step=`` on top; it returns the
    ``Confirmation`` (see the executors' key rule in the module docstring)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        async def run(op: str, request: dict[str, Any], call: Callable[[str], Any], **own: Any) -> Confirmation:
            ctx = own["ctx"]
            run_id = ctx.get_state(RUN_STATE) if ctx is not None else None
            if not isinstance(run_id, str) or not run_id:
                raise InvalidEffect(
                    f"{fn.__name__} needs ctx= (the handler's WorkflowContext) in a workflow whose state names "
                    "the run: set_run(ctx, run_id) in the start executor (the key is built from it)"
                )
            # The ledger's own thread makes the call: the workflow's event loop goes on meanwhile.
            return await asyncio.to_thread(
                ledger.execute,
                target=target,
                operation=op,
                request=request,
                call=call,
                run_id=run_id,
                step=own["step"] or step or fn.__name__,
                timeout=timeout,
            )

        return keyed(fn, operation, key_arg, {"ctx": None, "step": None}, run)

    return wrap


async def ask_person(ledger: SyncLedger, ctx: WorkflowContext[Any, Any], escalated: EffectUncertain) -> None:
    """Send the escalated effect to a person through ``ctx.request_info`` (the escalation dict; the
    response is the decision dict). Anything but an escalation is raised again."""
    if escalated.state != State.ESCALATED.value:
        raise escalated
    effect = ledger.get(escalated.effect_id)
    if effect is None:  # cannot happen: an escalated effect is recorded; say so rather than guess
        raise escalated
    await ctx.request_info(escalation(effect, escalated.reason), dict)


__all__ = [
    "ledger_tool",
    "run_identity",
    "answer",
    "escalation_of",
    "ledger_step",
    "set_run",
    "ask_person",
    "record",
    "RUN_ID",
    "RUN_STATE",
    "ESCALATION",
]
