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
DBOS pickles step outputs by default). ``EffectUncertain`` (an effect that a reconciler or a person
must resolve: ``effects resolve``), ``EffectInProgress`` and ``EffectClosed`` propagate out of the
step to the workflow. Synchronous steps only: the call runs on the ``SyncLedger``'s thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dbos import DBOS

from effect_ledger.streams.errors import InvalidEffect
from effect_ledger.streams.ledger import Confirmation, Ledger, bind_request
from effect_ledger.streams.sync import SyncLedger


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
        op, sig = Ledger.check_wrapped(fn, operation, key_arg)

        @functools.wraps(fn)
        def wrapper(*args: Any, step: str | None = step, **kwargs: Any) -> Confirmation:
            run_id, step_name = run_identity(fn, step)
            return ledger.execute(
                target=target,
                operation=op,
                request=bind_request(sig, key_arg, args, kwargs),
                call=lambda k: fn(*args, **{**kwargs, key_arg: k}),
                run_id=run_id,
                step=step_name,
                timeout=timeout,
            )

        return wrapper

    return wrap


__all__ = ["ledger_step", "run_identity"]
