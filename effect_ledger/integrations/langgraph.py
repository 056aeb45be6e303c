"""LangGraph: external writes in nodes and tools, keyed by the run, escalations as interrupts.

    from effect_ledger import SyncLedger
    from effect_ledger.langgraph import ledger_effect

    ledger = SyncLedger.open("effects.db", targets="targets.toml")

    @ledger_effect(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict:
        return gateway.refund(order, amount, idempotency_key=idempotency_key)

    def refund_node(state):            # a node of a graph compiled with a checkpointer
        return {"refund_id": refund(state["order"], state["amount"]).receipt_id}

The key rule (NEVER CHANGE IT: keys are stored in ledgers and handed to destinations; a different rule
turns a resumed run into a second refund)::

    run_id = config["configurable"]["thread_id"]
    step   = the step= given to the call, else the node's path: the checkpoint namespace without its
             task ids ("refund" for a node of the root graph, "billing|refund" for the node "refund"
             of the subgraph node "billing")
    key    = effect_key(target, operation, run_id, step, ledger namespace)

Nothing in it changes when LangGraph retries the node (``RetryPolicy``), when the thread is resumed
after a crash or an interrupt (the node runs again from its start), or when a person edits the state
meanwhile: task ids, checkpoint ids, superstep numbers and attempt counts are left out on purpose.
So within one thread a node writes one ``operation`` once: running it again with the same request
returns the recorded receipt; with a different request it raises ``EffectConflict``. A node that
makes several writes of one operation (a loop, one per order) names each with ``step=`` (from the
state, e.g. ``step=f"order-{order}"``). A node started by ``Send`` runs once per ``Send``: it must
give ``step=`` (refused otherwise). In a tool, pass ``step=tool_call_id`` (``InjectedToolCallId``):
the id is in the checkpointed messages, so it survives resumes.

An effect that needs a person (``EffectUncertain`` in state ESCALATED) becomes ``interrupt(value)``;
``value`` is a dict with ``"effect_ledger": "escalated"``, ``effect_id``, ``attempt``, ``target``,
``operation``, ``request``, ``reason``, ``decide`` (the choices) and ``answer`` (the answer's shape).
Resume the thread with ``Command(resume={"decision": "confirmed" | "absent" | "abandon", "by": ...,
"reason": ..., "receipt_id": ...})`` (see ``effect_ledger.integrations.decisions``): the
decision is recorded in the ledger (``decide``) and the node goes on:

* confirmed -> the call returns the recorded ``Confirmation`` (``value`` None, the person's
  ``receipt_id``); absent -> it executes again with the same key; abandon -> it raises
  ``EffectClosed`` (catch it in the node to route elsewhere).

The ledger is the record: when the process dies after recording a decision, the node run again finds
the effect decided and does not ask again.
A resume value already recorded for an earlier attempt of the same effect is never applied to a new
escalation of it (LangGraph hands the last resume value back to a node run after a failed one): the
call raises ``EffectUncertain`` instead; decide with ``effects resolve`` and invoke the thread again.
Other errors (``EffectUncertain`` in UNCERTAIN, ``EffectInProgress``) propagate: the run holds; a
``RetryPolicy(retry_on=EffectInProgress)`` waits out an attempt that may still land.

Synchronous nodes and tools only: the call runs on the ``SyncLedger``'s thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.config import get_config
from langgraph.types import interrupt

from effect_ledger.core.model import State
from effect_ledger.errors import EffectUncertain, InvalidEffect
from effect_ledger.integrations.decisions import already_applied, escalation, parse_decision
from effect_ledger.sdk._wrap import keyed
from effect_ledger.sdk.ledger import Confirmation
from effect_ledger.sdk.sync import SyncLedger

# LangGraph's own spelling of a checkpoint namespace ("parent:task_id|node:task_id") and of the path
# of a task started by Send; private in langgraph._internal._constants, pinned by the tests.
NS_SEP, NS_END, PUSH = "|", ":", "__pregel_push"
_MAX_DECISIONS = 3  # one per escalation of the call; more means the same answer keeps coming back


def node_path(checkpoint_ns: str) -> str:
    """The checkpoint namespace without task ids: ``"billing:1f0…|refund:a3c…"`` -> ``"billing|refund"``."""
    parts = (p.split(NS_END, 1)[0] for p in checkpoint_ns.split(NS_SEP))
    return NS_SEP.join(p for p in parts if p and not p.isdigit())


def run_identity(step: str | None = None) -> tuple[str, str]:
    """``(run_id, step)`` of the write being made now, by the key rule in the module docstring.
    Call it inside a node or a tool; ``InvalidEffect`` outside one or without a thread."""
    try:
        config = get_config()
    except RuntimeError:
        raise InvalidEffect("effect_ledger.langgraph is used outside a LangGraph node or tool") from None
    conf = config.get("configurable") or {}
    meta = config.get("metadata") or {}
    thread = conf.get("thread_id")
    if thread is None or thread == "":
        raise InvalidEffect(
            "the graph runs without a thread_id: compile it with a checkpointer and invoke it with "
            "config={'configurable': {'thread_id': ...}} (the key is built from it)"
        )
    if step is not None:
        return str(thread), step
    path = meta.get("langgraph_path") or ()
    if path and path[0] == PUSH:
        raise InvalidEffect(
            f"node {meta.get('langgraph_node')!r} was started by Send and runs once per Send: name its "
            "write with step= (from its input, e.g. the order id or the tool_call_id)"
        )
    where = node_path(str(conf.get("checkpoint_ns") or meta.get("langgraph_checkpoint_ns") or ""))
    if not where:
        raise InvalidEffect("cannot tell which node is running: give step=")
    return str(thread), where


def execute(
    ledger: SyncLedger,
    *,
    target: str,
    operation: str,
    request: Any,
    call: Callable[[str], Any],
    step: str | None = None,
    timeout: float | None = None,
) -> Confirmation:
    """``SyncLedger.execute`` keyed by the running node (see the key rule), with escalations turned
    into interrupts and the person's answer recorded (see the module docstring)."""
    run_id, step_name = run_identity(step)
    last: EffectUncertain | None = None
    for _ in range(_MAX_DECISIONS):
        try:
            return ledger.execute(
                target=target,
                operation=operation,
                request=request,
                call=call,
                run_id=run_id,
                step=step_name,
                timeout=timeout,
            )
        except EffectUncertain as e:
            if e.state != State.ESCALATED.value:
                raise
            last = e
            _ask_and_record(ledger, e)
    assert last is not None
    raise last


def _ask_and_record(ledger: SyncLedger, escalated: EffectUncertain) -> None:
    """Interrupt the graph with the escalated effect (the first time), or record the answer it was
    resumed with (when the node runs again)."""
    key = escalated.effect_id
    effect = ledger.get(key)
    if effect is None:  # cannot happen: an escalated effect is recorded; say so rather than guess
        raise escalated
    answer = interrupt(escalation(effect, escalated.reason))
    decision = parse_decision(answer)
    if decision.effect_id is not None and decision.effect_id != key:
        raise InvalidEffect(f"the resume value answers effect {decision.effect_id}, but {key} is escalated")
    if already_applied(effect, decision):
        raise EffectUncertain(
            key,
            f"escalated again (attempt {effect.attempt}) after this decision was recorded for an earlier "
            f"attempt; decide with `effects resolve {key} ...` and invoke the thread again",
            State.ESCALATED.value,
        )
    ledger.decide(key, decision.kind, by=decision.by, reason=decision.reason, receipt_id=decision.receipt_id)


def ledger_effect(
    ledger: SyncLedger,
    *,
    target: str,
    operation: str | None = None,
    timeout: float | None = None,
    key_arg: str = "idempotency_key",
) -> Callable[[Callable[..., Any]], Callable[..., Confirmation]]:
    """Decorate the function that makes one external write, for use inside a node or a tool. It
    receives the idempotency key as the keyword ``key_arg``; its other arguments form the request.
    The wrapper takes ``step=`` on top (see the key rule) and returns the ``Confirmation``.
    ``operation`` defaults to the function's name with ``_`` as ``.``."""

    def run(op: str, request: Any, call: Callable[[str], Any], *, step: str | None) -> Confirmation:
        return execute(ledger, target=target, operation=op, request=request, call=call, step=step, timeout=timeout)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Confirmation]:
        return keyed(fn, operation, key_arg, {"step": None}, run)

    return wrap


__all__ = ["ledger_effect", "execute", "run_identity", "node_path"]
