"""CrewAI: external writes in tools, keyed by the run and the task, escalations as a Flow's human feedback.

    from crewai import Agent, Crew, Task
    from effect_ledger import SyncLedger
    from effect_ledger.crewai import crew_run, ledger_tool

    ledger = SyncLedger.open("effects.db", targets="targets.toml")

    @ledger_tool(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict:
        "Refund an order (amount in cents)."
        return gateway.refund(order, amount, idempotency_key=idempotency_key)

    agent = Agent(..., tools=[refund], tool_failure_policy="raise")
    crew = Crew(agents=[agent], tasks=[Task(..., name="refund")])
    with crew_run("order-123", crew):          # in a Flow: crew_run(self.state.id, crew)
        crew.kickoff()

``ledger_tool`` returns a CrewAI tool (``crewai.tools.tool``) whose arguments, as the model sees them,
are the function's without the key. It returns the destination's answer (the recorded one when the
write was already made) to the model.

The key rule (NEVER CHANGE IT: keys are stored in ledgers and handed to destinations; a different rule
turns a retried task or a resumed flow into a second refund)::

    run_id = the run_id given to crew_run (in a Flow with @persist: self.state.id, which a kickoff
             with inputs={"id": ...} restores)
    step   = the decorator's step= (a string, or a function of the request, e.g. one key per order),
             else "<task name>|<tool name>" (the task's name=, else "task-<n>", its place in the crew)
    key    = effect_key(target, operation, run_id, step, ledger namespace)

Nothing in it changes when CrewAI retries the task (``max_retry_limit``: the same Task), retries the
tool after an exception, or when the flow is kicked off again from its saved state in a new process:
CrewAI's task, agent, crew and executor ids are fresh uuids in every process and are left out on
purpose (the task id only finds the task's name in the crew given to ``crew_run``). So within one run
a task's tool writes one ``operation`` once: the same request again returns the recorded answer, a
different one is refused (``EffectConflict``); a task that makes several writes of one operation
names each with ``step=lambda request: f"order-{request['order']}"``.

An effect that cannot go on (``EffectUncertain``: UNCERTAIN or ESCALATED, ``EffectInProgress``,
``EffectClosed``, ``EffectConflict``) is returned to CrewAI as a ``ToolFailure`` with the code
``effect_ledger.<error>`` and, for an escalation, the dict of ``decisions.escalation`` as its
``details``; with ``tool_failure_policy="raise"`` (agent, task or crew) CrewAI stops the crew with
``ToolExecutionFailedError`` instead of letting the model try again. Raising would not stop it:
CrewAI feeds a tool's exception to the model and runs the tool again.

A person's decision, the CrewAI way: in a Flow, ``kickoff`` returns the escalation instead of
raising, and ``EscalationFeedback`` is the ``@human_feedback`` provider that pauses the flow on it
(``HumanFeedbackPending``, persisted by ``@persist``); ``Flow.from_pending(id).resume(json_decision)``
hands the decision (``decisions`` shape, as JSON) to the method's listener, which passes
``self.last_human_feedback`` to ``kickoff`` again: the decision is recorded (only while the effect is
still ESCALATED, so a replay records nothing twice) and the crew runs again: confirmed -> the tool
returns the recorded answer; absent -> the write is made again with the same key; abandon -> the
tool fails with ``effect_ledger.EffectClosed``.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from crewai.context import get_current_task_id
from crewai.flow.async_feedback.types import HumanFeedbackPending, PendingFeedbackContext
from crewai.tools import tool
from crewai.tools.tool_failure import ToolFailure

from effect_ledger.core.model import State
from effect_ledger.errors import (
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectUncertain,
    InvalidEffect,
    LedgerError,
)
from effect_ledger.integrations.decisions import escalation, parse_decision
from effect_ledger.sdk._wrap import keyed
from effect_ledger.sdk.receipts import Confirmation
from effect_ledger.sdk.sync import SyncLedger

ESCALATED = "effect_ledger.escalated"  # the ToolFailure code of an escalation, and kickoff's marker
# The run cannot go on with this write now: told to CrewAI as a ToolFailure. Other errors (the ledger
# unavailable, a programming error) are raised.
HOLDS = (EffectUncertain, EffectInProgress, EffectClosed, EffectConflict)


@dataclass(frozen=True, slots=True)
class _Run:
    run_id: str
    tasks: Mapping[str, str]  # CrewAI's task id (a uuid of this process) -> the task's stable name


_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("effect_ledger_crewai_run", default=None)


def task_names(crew: Any) -> dict[str, str]:
    """The stable name of each task of ``crew`` by its id: its ``name``, else ``task-<n>`` (1-based)."""
    return {str(t.id): (t.name or f"task-{i}") for i, t in enumerate(crew.tasks, 1)}


@contextlib.contextmanager
def crew_run(run_id: str, crew: Any) -> Iterator[None]:
    """Run ``crew.kickoff()`` inside this: the tools' keys are built from ``run_id`` (see the key rule)."""
    if not run_id:
        raise InvalidEffect("crew_run needs a run id (in a Flow: self.state.id)")
    token = _RUN.set(_Run(str(run_id), task_names(crew)))
    try:
        yield
    finally:
        _RUN.reset(token)


def run_identity(tool_name: str, step: str | None = None) -> tuple[str, str]:
    """``(run_id, step)`` of a write the tool ``tool_name`` makes now, by the key rule."""
    run = _RUN.get()
    if run is None:
        raise InvalidEffect(f"tool {tool_name!r} runs outside crew_run(run_id, crew): the key is built from the run")
    if step is not None:
        return run.run_id, step
    task_id = get_current_task_id()
    task = run.tasks.get(task_id or "")
    if task is None:
        raise InvalidEffect(f"tool {tool_name!r} runs outside a task of the crew given to crew_run: give step=")
    return run.run_id, f"{task}|{tool_name}"


def _failure(e: LedgerError, ledger: SyncLedger) -> ToolFailure:
    """What CrewAI is told when the write cannot go on now (see the module docstring)."""
    details: dict[str, Any] = {}
    code = f"effect_ledger.{type(e).__name__}"
    if isinstance(e, EffectUncertain) and e.state == State.ESCALATED.value:
        effect = ledger.get(e.effect_id)
        if effect is not None:
            details, code = escalation(effect, e.reason), ESCALATED
    return ToolFailure(message=str(e), code=code, details=details)


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
    """Decorate the function that makes one external write: the result is a CrewAI tool (``name``
    defaults to the function's). The function receives the idempotency key as the keyword
    ``key_arg`` and needs a docstring (the tool's description); its other arguments form the request."""

    def wrap(fn: Callable[..., Any]) -> Any:
        tool_name = name or fn.__name__

        def run(op: str, request: dict[str, Any], call: Callable[[str], Any]) -> Any:
            try:
                run_id, step_name = run_identity(tool_name, step(request) if callable(step) else step)
                c: Confirmation = ledger.execute(
                    target=target,
                    operation=op,
                    request=request,
                    call=call,
                    run_id=run_id,
                    step=step_name,
                    timeout=timeout,
                )
            except HOLDS as e:
                return _failure(e, ledger)
            # The destination's own receipt id, and its answer when it gave one (the recorded one on a
            # retry: the model sees the same thing whether or not the write was made just now).
            return {"receipt_id": c.receipt_id, "effect_id": c.effect_id, "result": c.value}

        wrapper = keyed(fn, operation, key_arg, {}, run)
        # The model sees the arguments without the key (CrewAI builds the tool's schema from this).
        sig = inspect.signature(fn, eval_str=True)
        wrapper.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != key_arg])  # type: ignore[attr-defined]
        del wrapper.__wrapped__  # type: ignore[attr-defined]
        wrapper.__annotations__ = {k: v for k, v in wrapper.__annotations__.items() if k != key_arg}
        return tool(tool_name)(wrapper)

    return wrap


def escalation_of(output: Any) -> dict[str, Any] | None:
    """The escalation in ``output`` (kickoff's return, a feedback context's method output), if any."""
    if isinstance(output, Mapping) and output.get("effect_ledger") == "escalated":
        return dict(output)
    return None


def kickoff(
    ledger: SyncLedger, crew: Any, run_id: str, *, inputs: dict[str, Any] | None = None, feedback: Any = None
) -> Any:
    """``crew.kickoff(inputs)`` inside ``crew_run(run_id, crew)``; returns the crew's output, or the
    escalation dict when a tool escalated (return it from a ``@human_feedback`` method whose provider
    is ``EscalationFeedback``). ``feedback`` (a ``HumanFeedbackResult``, its JSON text or a mapping)
    is a person's decision, recorded before the crew runs again while the effect is still ESCALATED."""
    if feedback is not None:
        record_decision(ledger, feedback)
    with crew_run(run_id, crew):
        try:
            return crew.kickoff(inputs=inputs)
        except Exception as e:  # CrewAI's ToolExecutionFailedError; its module is private
            record = getattr(e, "record", None)
            failure = getattr(record, "failure", None)
            if isinstance(failure, ToolFailure) and failure.code == ESCALATED:
                return dict(failure.details)
            raise


def record_decision(ledger: SyncLedger, feedback: Any) -> bool:
    """Record a person's decision (``decisions`` shape) on the effect it answers; False when the effect
    was decided already (a resumed flow replaying its feedback) or the feedback is empty."""
    text = getattr(feedback, "feedback", feedback)
    if text is None or text == "":
        return False
    decision = parse_decision(json.loads(text) if isinstance(text, str) else text)
    asked = escalation_of(getattr(feedback, "output", None))
    key = decision.effect_id or (asked or {}).get("effect_id")
    if not key:
        raise InvalidEffect("the decision names no effect: give effect_id")
    now = ledger.get(key)
    if now is None or now.state is not State.ESCALATED:
        return False
    # An answer about an earlier attempt never decides a later escalation of the same effect.
    if asked is not None and asked.get("effect_id") == key and asked.get("attempt") not in (None, now.attempt):
        raise InvalidEffect(
            f"this feedback is about attempt {asked['attempt']} of {key}, which is escalated again at "
            f"attempt {now.attempt}: decide the new escalation"
        )
    ledger.decide(key, decision.kind, by=decision.by, reason=decision.reason, receipt_id=decision.receipt_id)
    return True


class EscalationFeedback:
    """A CrewAI ``HumanFeedbackProvider`` for ``@human_feedback``: a method output that is an
    escalation pauses the flow (``HumanFeedbackPending``, with the escalation as ``callback_info``);
    any other output goes on at once, with no feedback."""

    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        """Pause on an escalation; otherwise no feedback."""
        asked = escalation_of(context.method_output)
        if asked is None:
            return ""
        raise HumanFeedbackPending(context=context, callback_info=asked)


__all__ = [
    "ledger_tool",
    "crew_run",
    "kickoff",
    "record_decision",
    "run_identity",
    "task_names",
    "escalation_of",
    "EscalationFeedback",
    "ESCALATED",
]
