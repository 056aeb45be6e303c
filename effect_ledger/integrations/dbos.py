"""DBOS: external writes in ``@DBOS.step`` functions, keyed by the workflow.

    from dbos import DBOS
    from effect_ledger import SyncLedger
    from effect_ledger.dbos import ledger_step

    ledger = SyncLedger.open("effects.db", targets="targets.toml")

    @DBOS.step()
    @ledger_step(ledger, target="payments", operation="refund.create")
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict:
        return gateway.refund(order, amount, idempotency_key=idempotency_key)

The key rule (NEVER CHANGE IT: keys are stored in ledgers and handed to destinations; a different rule
turns a recovered workflow into a second refund)::

    run_id = DBOS.workflow_id
    step   = the step= given to the call, else the decorator's step=, else the function's name
             ("refund"; the same for a method or a nested function, so moving it keeps its keys)
    key    = effect_key(target, operation, run_id, step, ledger namespace)

Nothing in it changes when DBOS recovers the workflow (another process, after a crash) or retries the
step (``retries_allowed``). The step's number in the workflow (``DBOS.step_id``) is left out on
purpose: a workflow that calls the step again after it failed gets a new step id, and the second
call must be the same write, so that an uncertain first attempt is reconciled rather than repeated.
So within one workflow one step function writes one ``operation`` once: the same request again
returns the recorded receipt, a different one raises ``EffectConflict``; a workflow that makes
several writes of one operation (one per order) names each with ``step=``. Give your workflows
their own ids (``SetWorkflowID``, e.g. the order id) to tie the key to the business. A forked
workflow (``DBOS.fork_workflow``) has a new id, hence new keys: forking to before a write makes it
again.

The call returns the ``Confirmation``: it is the step's output that DBOS records (a dataclass;
DBOS pickles step outputs by default). ``EffectUncertain``, ``EffectInProgress`` and
``EffectClosed`` propagate out of the step to the workflow (DBOS records them and raises them again
on replay). Synchronous steps only: the call runs on the ``SyncLedger``'s thread.

A person's decision, the DBOS way: wrap the workflow's calls in ``with_decisions``::

    @DBOS.workflow()
    def refund_order(order: str, amount: int) -> str:
        return with_decisions(ledger, lambda: refund(order, amount)).receipt_id

When an effect escalates (``EffectUncertain`` in state ESCALATED), the workflow publishes it as its
event ``ESCALATION_EVENT`` (``DBOS.get_event(workflow_id, ESCALATION_EVENT)``: the dict described in
``effect_ledger.integrations.decisions.escalation``) and waits, durably, for a message on
``DECISION_TOPIC``; ``send_decision(workflow_id, {"decision": "confirmed" | "absent" | "abandon",
"by": ..., "reason": ..., "receipt_id": ...})`` sends it. The decision is recorded in the ledger and
the calls run again: confirmed -> the recorded receipt; absent -> executed again with the same key;
abandon -> ``EffectClosed``. A decision is recorded only while the effect is still ESCALATED, so a
recovered workflow that replays it records nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dbos import DBOS

from effect_ledger.core.model import State
from effect_ledger.errors import EffectUncertain, InvalidEffect
from effect_ledger.integrations.decisions import escalation, parse_decision
from effect_ledger.sdk._wrap import keyed
from effect_ledger.sdk.ledger import Confirmation
from effect_ledger.sdk.sync import SyncLedger

T = TypeVar("T")
ESCALATION_EVENT = "effect_ledger.escalated"
DECISION_TOPIC = "effect_ledger.decision"
DAY_S = 24 * 3600.0
_MAX_DECISIONS = 3  # one per escalation of the calls


def run_identity(fn: Callable[..., Any], step: str | None = None) -> tuple[str, str]:
    """``(run_id, step)`` of a write made now by ``fn``, by the key rule in the module docstring."""
    workflow_id = DBOS.workflow_id
    if not workflow_id:
        raise InvalidEffect(f"{fn.__name__} runs outside a DBOS workflow: the key is built from the workflow id")
    return str(workflow_id), step or fn.__name__


def ledger_step(
    ledger: SyncLedger,
    *,
    target: str,
    operation: str | None = None,
    step: str | None = None,
    timeout: float | None = None,
    key_arg: str = "idempotency_key",
) -> Callable[[Callable[..., Any]], Callable[..., Confirmation]]:
    """Decorate the function that makes one external write; put ``@DBOS.step()`` above it. It
    receives the idempotency key as the keyword ``key_arg``; its other arguments form the request.
    The wrapper takes ``step=`` on top (see the key rule) and returns the ``Confirmation``.
    ``operation`` defaults to the function's name with ``_`` as ``.``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Confirmation]:
        def run(op: str, request: Any, call: Callable[[str], Any], *, step: str | None) -> Confirmation:
            run_id, step_name = run_identity(fn, step)
            return ledger.execute(
                target=target, operation=op, request=request, call=call, run_id=run_id, step=step_name, timeout=timeout
            )

        return keyed(fn, operation, key_arg, {"step": step}, run)

    return wrap


def with_decisions(ledger: SyncLedger, calls: Callable[[], T], *, wait_s: float = DAY_S) -> T:
    """Run ``calls`` (which call ``ledger_step`` steps) in a workflow; when an effect escalates, wait
    up to ``wait_s`` for a person's decision (see the module docstring), record it, run ``calls``
    again. No decision in time: the ``EffectUncertain`` is raised."""
    for _ in range(_MAX_DECISIONS):
        try:
            return calls()
        except EffectUncertain as e:
            if e.state != State.ESCALATED.value:
                raise
            escalated = e
        _await_decision(ledger, escalated, wait_s)
    return calls()


def _await_decision(ledger: SyncLedger, escalated: EffectUncertain, wait_s: float) -> None:
    """Publish the escalation, wait for the decision (both durable DBOS operations, replayed on
    recovery) and record it while the effect is still ESCALATED (a replay finds it decided)."""
    key = escalated.effect_id
    effect = ledger.get(key)
    if effect is None:  # cannot happen: an escalated effect is recorded; say so rather than guess
        raise escalated
    DBOS.set_event(ESCALATION_EVENT, escalation(effect, escalated.reason))
    message = DBOS.recv(DECISION_TOPIC, timeout_seconds=wait_s)
    if message is None:
        raise escalated
    decision = parse_decision(message)
    if decision.effect_id is not None and decision.effect_id != key:
        raise InvalidEffect(f"the decision answers effect {decision.effect_id}, but {key} is escalated")
    now = ledger.get(key)
    if now is not None and now.state is State.ESCALATED:
        ledger.decide(key, decision.kind, by=decision.by, reason=decision.reason, receipt_id=decision.receipt_id)


def send_decision(workflow_id: str, decision: dict[str, Any]) -> None:
    """Send a person's decision to a workflow waiting in ``with_decisions`` (checked before it is sent)."""
    parse_decision(decision)
    DBOS.send(workflow_id, dict(decision), topic=DECISION_TOPIC)


__all__ = ["ledger_step", "run_identity", "with_decisions", "send_decision", "ESCALATION_EVENT", "DECISION_TOPIC"]
