"""The one decorator behind every decorator form: ``Ledger.effect``, ``SyncLedger.effect``,
``effect_ledger.langgraph.ledger_effect`` and ``effect_ledger.dbos.ledger_step``.

A wrapped function makes one external write and accepts the idempotency key as the keyword
``key_arg``; its other arguments, by name with defaults applied, are the request. The wrapper takes
a few keywords of its own on top (``run_id=``, ``step=``, ``key=``, whichever its form offers) and
hands the rest to ``run``, which keys the write and executes it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from effect_ledger.core.keys import check_name
from effect_ledger.errors import InvalidEffect

#: ``run(operation, request, call, **own)``: execute the write; ``call(key)`` calls the wrapped function.
Run = Callable[..., Any]


def check_wrapped(fn: Callable[..., Any], operation: str | None, key_arg: str) -> tuple[str, inspect.Signature]:
    """The operation name and signature of a function a decorator wraps (it must take the key)."""
    op = operation or fn.__name__.replace("_", ".")
    check_name("operation", op)
    sig = inspect.signature(fn)
    if key_arg not in sig.parameters:
        raise InvalidEffect(f"{fn.__name__} must accept the idempotency key as keyword {key_arg!r}")
    return op, sig


def bind_request(sig: inspect.Signature, key_arg: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request of a decorated call: its arguments by name, defaults applied, without the key."""
    bound = sig.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k != key_arg}


def keyed(
    fn: Callable[..., Any], operation: str | None, key_arg: str, own: Mapping[str, Any], run: Run
) -> Callable[..., Any]:
    """``fn`` wrapped: the keywords named in ``own`` (with their defaults) are the wrapper's, the
    rest go to ``fn``. An async ``run`` gives an async wrapper (``inspect.iscoroutinefunction`` holds,
    as frameworks check)."""
    op, sig = check_wrapped(fn, operation, key_arg)

    def prepared(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], Callable[[str], Any], dict]:
        mine = {name: kwargs.pop(name, default) for name, default in own.items()}
        request = bind_request(sig, key_arg, args, kwargs)
        return request, lambda k: fn(*args, **{**kwargs, key_arg: k}), mine

    if inspect.iscoroutinefunction(run):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            request, call, mine = prepared(args, kwargs)
            return await run(op, request, call, **mine)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        request, call, mine = prepared(args, kwargs)
        return run(op, request, call, **mine)

    return wrapper


__all__ = ["keyed", "check_wrapped", "bind_request"]
