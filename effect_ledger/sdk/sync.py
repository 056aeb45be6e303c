"""``SyncLedger``: the SDK for synchronous callers (a LangGraph node, a Celery task, a script).

    ledger = SyncLedger.open("effects.db", targets="targets.toml")
    receipt = ledger.execute(
        target="payments", operation="refund.create", run_id=run_id, step="refund-order-123",
        request={"order": "123", "amount": 4800},
        call=lambda key: gateway.refund("123", 4800, idempotency_key=key),
        timeout=10.0,
    )

It is the async ``Ledger``: the per-call decision, the records and the errors are exactly those of
``Ledger`` (the SDK contract suite runs against both). Opened once, it serves every call of the
process from any thread. The ledger has an event loop of its own, in a background thread that
lives as long as it does: the file is opened there, its checkpoints run there and, in Kafka mode,
the relay and the lookups, which keep running between calls.

Where an operation runs: embedded (no Kafka), on the caller's thread, on an event loop of that
thread (one per thread, kept while the thread lives, nothing else runs on it): the caller waits
anyway, and handing each operation to the ledger's thread and back cost more than the ledger's
work itself (two thread wake-ups each way). Its writes commit on the caller's thread, one at a
time with other threads' (``Store._commit_here``). In Kafka mode, and from a thread that already
runs an event loop, the operation is handed to the ledger's loop, where the relay and the lookups
live, and the caller waits for it.

Where the call runs: in a thread other than the caller's, with the caller's context variables, so
the ledger's deadline can fire while the call blocks (or in the caller's own thread, with
``inline_calls``: below). Call threads are kept between calls
(``_CallThreads``): starting a thread per call made the loop wait for each new thread to run,
a fifth of the sync path's cost. On Linux the hand-off stays on one core (``_OneCore``): the
caller sleeps while its call runs, so the two never need two cores, and crossing to the other
one (waking an idle core, then running on a cold cache) cost a virtual machine about 300 us a
call, more than the ledger's own work. A call that outlives ``timeout`` cannot be
stopped (Python threads cannot be killed): the ledger records its outcome as unknown at the
deadline and raises ``EffectUncertain`` to the caller, and whatever the call does or returns
afterwards is not recorded; a reconciler then asks the destination, by key, whether it happened.
The call's thread is a daemon thread, so a call that never returns does not keep the process alive.

``inline_calls=True`` (embedded only) runs the call in the caller's thread instead: no hand-off to a
call thread and back, which on a virtual machine costs what waking an idle core costs there (two
wake-ups a call, measured by ``make bench`` beside the rest). What it gives up is the cut-off: a call
that hangs holds its caller until it returns, so use it only with a destination client that keeps
its own timeout. What is recorded does not change: a call that returns after its deadline is
recorded unknown and raises ``EffectUncertain``, as one cut off at the deadline does (its lease has
run out; another attempt may own the key by then). In Kafka mode, and from a thread that already
runs an event loop, calls still run in a call thread: the operation runs on the ledger's loop there,
which a call must not block.
``call`` is a plain function (an async one is refused: use ``Ledger``); if it returns an awaitable,
that is run to completion on a fresh event loop in the call's thread.

Interrupted (Ctrl-C while a call blocks): the caller gets its ``KeyboardInterrupt`` at once; the
ledger records the call's outcome as unknown. Ctrl-C elsewhere in an operation on the main thread
cancels it at its next await, as ``asyncio.run`` does (``_Interrupt``: a ``KeyboardInterrupt``
raised inside a write could leave the shared connection in a transaction); a second Ctrl-C raises
at once. ``close()`` (and the end of a ``with`` block) refuses new calls and lets calls in flight in
other threads end first, each by its deadline at the latest; called from a signal handler during an
operation of its own thread, it closes under that operation, whose call's outcome is then left for
reconciliation (``EffectUncertain``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import queue
import signal
import threading
import time

# The C functions under ``signal.getsignal`` and ``signal.signal``, which wrap every handler in an
# enum on its way in and out: 8 of the 9 us an operation's Ctrl-C handler cost (``_Interrupt``).
from _signal import getsignal as _getsignal
from _signal import signal as _setsignal
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import DecisionKind, ReceiptSource
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import EffectUncertain, InvalidEffect, LedgerClosed
from effect_ledger.sdk._executor import TimedCall
from effect_ledger.sdk._wrap import keyed
from effect_ledger.sdk.ledger import Confirmation, Ledger
from effect_ledger.sdk.store.sqlite import Store

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class SyncLedger:
    """The ``Ledger`` for synchronous code. Thread-safe; close it (or use ``with``) so the relay can
    send what is left."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, ledger: Ledger, *, inline_calls: bool = False
    ) -> None:
        self._loop = loop
        self._thread = thread
        self._ledger = ledger
        self._closed = False
        self._busy = 0  # operations handed to the loop and not finished there
        self._idle = threading.Condition()
        self._calls = _CallThreads()
        self._inline_calls = inline_calls

    @classmethod
    def open(cls, path: str, *, inline_calls: bool = False, **kwargs: Any) -> SyncLedger:
        """Open (or create) the ledger file; the arguments are ``Ledger.open``'s, and
        ``inline_calls``: run each call in the caller's thread, without the cut-off at its deadline
        (embedded only; see the module's note)."""
        if not isinstance(inline_calls, bool):
            raise InvalidEffect(f"inline_calls must be True or False, not {inline_calls!r}")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"effect-ledger:{path}", daemon=True)
        thread.start()
        try:
            ledger = asyncio.run_coroutine_threadsafe(Ledger.open(path, **kwargs), loop).result()
        except BaseException:
            _stop(loop, thread)
            raise
        return cls(loop, thread, ledger, inline_calls=inline_calls)

    def __enter__(self) -> SyncLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, relay_timeout: float = 10.0) -> None:
        """Refuse new calls, let those in flight in other threads end (each ends by its deadline at
        the latest, recorded as usual), then close the ledger (see ``Ledger.close``) and stop its
        thread. Closing twice is harmless."""
        self._not_on_the_loop()
        with self._idle:
            if self._closed:
                return
            self._closed = True
            # Stopping the loop under an operation would leave its caller waiting forever. Called
            # from a signal handler on a thread whose own operation it interrupted, that one
            # cannot end first: it finds the ledger closed when it goes on.
            own = _LOOPS.running.get(id(self), 0)
            self._idle.wait_for(lambda: self._busy <= own)
        try:
            asyncio.run_coroutine_threadsafe(self._ledger.close(relay_timeout), self._loop).result()
        finally:
            _stop(self._loop, self._thread)
            self._calls.close()

    def _not_on_the_loop(self) -> None:
        if threading.current_thread() is self._thread:
            raise InvalidEffect(
                "SyncLedger called from its own event loop (from a reconciler?), where it would wait on "
                "itself: use the async Ledger there (SyncLedger.ledger)"
            )

    def _here(self) -> asyncio.AbstractEventLoop | None:
        """The loop of the caller's thread to run an operation on, or None when it goes to the
        ledger's loop (Kafka mode; a thread that already runs a loop, which cannot run another)."""
        if not self._ledger.embedded or _running_loop() is not None:
            return None
        loop = _thread_loop()
        # Running already: an operation made from inside an inline call (``inline_calls``) of this
        # thread, whose loop waits for that call. It goes to the ledger's loop.
        return None if loop.is_running() else loop

    def _run(self, coro: Coroutine[Any, Any, T], here: asyncio.AbstractEventLoop | None = None) -> T:
        """Run one ``Ledger`` operation and wait for it in the calling thread: on ``here``, the
        caller's own loop (see ``_here``), else on the ledger's loop."""
        try:
            self._not_on_the_loop()
            with self._idle:
                if self._closed:
                    raise LedgerClosed(f"ledger {self._ledger.store.path} is closed")
                self._busy += 1
        except BaseException:
            coro.close()
            raise
        if here is not None:
            running = _LOOPS.running
            running[id(self)] = running.get(id(self), 0) + 1
            try:
                return _run_here(here, coro)
            finally:
                running[id(self)] -= 1
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
        done: Future[T] = Future()

        def start() -> None:
            task = self._loop.create_task(coro)
            task.add_done_callback(functools.partial(self._finished, done))
            # The caller gave up waiting (Ctrl-C): cancel the operation on the loop, where Ledger
            # records an interrupted call's outcome as unknown before the task ends.
            done.add_done_callback(lambda f: f.cancelled() and self._loop.call_soon_threadsafe(task.cancel))

        self._loop.call_soon_threadsafe(start)
        try:
            return done.result()
        except BaseException:
            done.cancel()
            raise

    def _finished(self, done: Future[T], task: asyncio.Task[T]) -> None:
        # The caller's answer first, then "not busy": close() may stop the loop after that.
        try:
            if task.cancelled():
                done.cancel()
            elif (exc := task.exception()) is not None:
                done.set_exception(_for_the_caller(exc))
            else:
                done.set_result(task.result())
        except InvalidStateError:
            pass  # the caller gave up waiting meanwhile
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    @property
    def inline_calls(self) -> bool:
        """Whether calls run in the caller's thread (embedded, on the caller's own loop), without the
        cut-off at their deadline."""
        return self._inline_calls

    @property
    def ledger(self) -> Ledger:
        """The async ``Ledger`` underneath (use it only from its own loop)."""
        return self._ledger

    @property
    def store(self) -> Store:
        """The ledger's store: ``path`` and ``closed`` are safe to read; its coroutines belong to the
        ledger's own loop."""
        return self._ledger.store

    @property
    def worker(self) -> str:
        """This ledger's identity as a claim owner, written into its intents' ``worker`` field."""
        return self._ledger.worker

    @property
    def targets(self) -> dict[str, Target]:
        """The declared targets by name."""
        return self._ledger.targets

    def now_ms(self) -> int:
        """The ledger's clock, in epoch milliseconds."""
        return self._ledger.now_ms()

    def execute(
        self,
        *,
        target: str,
        operation: str,
        request: Any,
        call: Callable[[str], Any],
        run_id: str | None = None,
        step: str | None = None,
        key: str | None = None,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> Confirmation:
        """``Ledger.execute`` for a synchronous ``call(key)``, run in a thread of its own under the
        deadline (see the module's note on a call that outlives it), or in the caller's thread
        (``inline_calls``)."""
        if not callable(call):
            raise InvalidEffect("call must be a function of the idempotency key")
        if _is_async(call):
            raise InvalidEffect("call is async: SyncLedger runs plain functions (use Ledger.execute for async ones)")
        context = contextvars.copy_context()  # the caller's, not the loop thread's
        here = self._here()
        # On the caller's loop the ledger waits for the call's thread by blocking (nothing else runs
        # there); on the ledger's loop, for a future of that loop.
        run: Callable[[str], Any]
        if here is None:
            run = functools.partial(_in_thread, self._calls, call, context)
        elif self._inline_calls:
            run = _OnCallersThread(self._calls, call, context)
        else:
            run = _OnCallThread(self._calls, call, context)
        return self._run(
            self._ledger.execute(
                target=target,
                operation=operation,
                request=request,
                call=run,
                run_id=run_id,
                step=step,
                key=key,
                namespace=namespace,
                timeout=timeout,
            ),
            here,
        )

    def record_receipt(
        self,
        key: str,
        receipt_id: str,
        value: Any = None,
        *,
        source: ReceiptSource | str = ReceiptSource.WEBHOOK,
        attempt: int = 0,
        allow_unknown: bool = False,
    ) -> Effect:
        """``Ledger.record_receipt``."""
        return self._run(
            self._ledger.record_receipt(
                key, receipt_id, value, source=source, attempt=attempt, allow_unknown=allow_unknown
            ),
            self._here(),
        )

    def decide(
        self, key: str, decision: DecisionKind | str, *, by: str, reason: str, receipt_id: str | None = None
    ) -> Effect:
        """``Ledger.decide``."""
        return self._run(self._ledger.decide(key, decision, by=by, reason=reason, receipt_id=receipt_id), self._here())

    def get(self, key: str) -> Effect | None:
        """``Ledger.get``."""
        return self._run(self._ledger.get(key), self._here())

    def expire(self, key: str) -> Effect | None:
        """``Ledger.expire``."""
        return self._run(self._ledger.expire(key), self._here())

    def effect(
        self,
        *,
        target: str,
        operation: str | None = None,
        timeout: float | None = None,
        key_arg: str = "idempotency_key",
    ) -> Callable[[F], Callable[..., Any]]:
        """``Ledger.effect`` for a plain function: its arguments are the request, it receives the
        key as ``key_arg``; the wrapper takes ``run_id=``/``step=`` (or ``key=``) on top."""

        def wrap(fn: F) -> Callable[..., Any]:
            if _is_async(fn):
                raise InvalidEffect(f"{fn.__name__} is async: SyncLedger.effect wraps plain functions (Ledger.effect)")

            def run(op: str, request: Any, call: Callable[[str], Any], **own: Any) -> Any:
                return self.execute(
                    target=target, operation=op, request=request, timeout=timeout, call=call, **own
                ).value

            return keyed(fn, operation, key_arg, {"run_id": None, "step": None, "key": None}, run)

        return wrap


class CallExited(Exception):
    """A call ended with ``SystemExit`` (or another non-``Exception``): recorded as an unknown
    outcome, then re-raised to the caller. It must not reach the loop, which it would stop."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}({original})")
        self.original = original


def _for_the_caller(exc: BaseException) -> BaseException:
    """A call that exited was recorded unknown; its caller gets what the call raised."""
    if isinstance(exc, EffectUncertain) and isinstance(exc.__cause__, CallExited):
        return exc.__cause__.original
    return exc


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _OwnLoop:
    """A thread's own event loop for ledger operations, closed when the thread ends (its
    ``threading.local`` goes, and this with it)."""

    __slots__ = ("loop",)

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __del__(self) -> None:
        if not self.loop.is_running():
            self.loop.close()


class _Loops(threading.local):
    own: _OwnLoop | None = None
    # In ``_OnCallThread.within``'s wait: a Ctrl-C there raises at once (the call runs elsewhere).
    waiting_for_call = False

    def __init__(self) -> None:
        self.running: dict[int, int] = {}  # id(SyncLedger) -> its operations on this thread now


_LOOPS = _Loops()


def _thread_loop() -> asyncio.AbstractEventLoop:
    """The calling thread's own loop (made on its first operation), shared by every ledger."""
    own = _LOOPS.own
    if own is None or own.loop.is_closed():
        own = _LOOPS.own = _OwnLoop()
    return own.loop


_SIGINT = int(signal.SIGINT)


class _Interrupt:
    """Ctrl-C on the main thread while an operation runs on its loop. Python raises
    ``KeyboardInterrupt`` between any two bytecodes, which in the store's code could leave a
    transaction open on the shared connection or another thread's write undone; so, as
    ``asyncio.run`` does, the first Ctrl-C cancels the operation's task instead (it ends at its next
    await, as a cancelled ``Ledger.execute`` does: a call under way recorded unknown), and the caller
    then gets ``KeyboardInterrupt``. While the operation waits for its call (``within``), and at a
    second Ctrl-C, ``KeyboardInterrupt`` is raised at once. Installed only on the main thread, over
    Python's default handler (an application's own handler is left alone)."""

    __slots__ = ("loop", "task", "asked", "previous")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop, self.task = loop, task
        self.asked = False
        self.previous: Any = None

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> _Interrupt | None:
        if threading.current_thread() is not threading.main_thread():
            return None  # Python delivers signals to the main thread only
        if _getsignal(_SIGINT) is not signal.default_int_handler:
            return None
        self = cls(loop, task)
        self.previous = _setsignal(_SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.asked or _LOOPS.waiting_for_call:
            raise KeyboardInterrupt
        self.asked = True
        self.task.cancel()
        self.loop.call_soon_threadsafe(lambda: None)  # wakes the loop if it waits

    def uninstall(self) -> None:
        if _getsignal(_SIGINT) == self._on_sigint:
            _setsignal(_SIGINT, self.previous)


def _run_here(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run an operation to its end on the caller's own loop (see ``_Interrupt`` for Ctrl-C).
    Interrupted anyway while the loop waited, the operation is cancelled and run to its end
    first, as ``Ledger`` ends a cancelled task; the caller then gets its interruption."""
    task = loop.create_task(coro)
    interrupt = _Interrupt.install(loop, task)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        if interrupt is not None and interrupt.asked:
            raise KeyboardInterrupt from None
        raise
    except BaseException as e:
        if not task.done():
            task.cancel()
            try:
                loop.run_until_complete(task)
            except BaseException:  # noqa: S110 - the caller gets its own interruption below
                pass
            raise
        mapped = _for_the_caller(e)
        if mapped is e:
            raise
        raise mapped from None
    finally:
        if interrupt is not None:
            interrupt.uninstall()


def _is_async(fn: Any) -> bool:
    """An async function, a partial of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _in_thread(
    threads: _CallThreads, call: Callable[[str], Any], context: contextvars.Context, key: str
) -> asyncio.Future[Any]:
    """Start ``call(key)`` in a call thread; the returned future (of the running loop) completes
    with its result. A call that hangs past its deadline holds only its own thread."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[Any] = loop.create_future()

    def deliver(value: Any, exc: BaseException | None) -> None:
        if result.done():  # cut off at the deadline (or cancelled): what it did is not recorded
            return
        if exc is None:
            result.set_result(value)
        else:
            result.set_exception(exc if isinstance(exc, Exception) else CallExited(exc))

    def run() -> None:
        value, exc = _called(call, context, key)
        try:
            loop.call_soon_threadsafe(deliver, value, exc)
        except RuntimeError:  # the ledger was closed meanwhile: nobody waits for this any more
            pass

    threads.run(run, f"effect-ledger call {key[:40]}")
    return result


class _OnCallThread(TimedCall):
    """The call for an operation run on the caller's own loop: ``within`` hands it to a call
    thread and blocks the caller's thread until it returns or its time is up (``TimeoutError``:
    recorded unknown; what it does or returns afterwards is not recorded). A replay (``__call__``)
    returns a future of the running loop, as on the ledger's loop."""

    __slots__ = ("threads", "call", "context")

    def __init__(self, threads: _CallThreads, call: Callable[[str], Any], context: contextvars.Context) -> None:
        self.threads = threads
        self.call = call
        self.context = context

    def __call__(self, key: str) -> asyncio.Future[Any]:
        return _in_thread(self.threads, self.call, self.context, key)

    def within(self, key: str, left_s: float) -> Any:
        answer: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        call, context = self.call, self.context

        def run() -> None:
            answer.put(_called(call, context, key))

        core = _OneCore()
        try:
            core.enter()
            self.threads.run(run, f"effect-ledger call {key[:40]}", core)
            _LOOPS.waiting_for_call = True
            try:
                value, exc = answer.get(timeout=max(left_s, 0.0))
            except queue.Empty:
                raise TimeoutError from None
            finally:
                _LOOPS.waiting_for_call = False
        finally:
            core.leave()
        if exc is None:
            return value
        raise exc if isinstance(exc, Exception) else CallExited(exc)


class _OnCallersThread(_OnCallThread):
    """The call for ``inline_calls``: ``within`` makes it here, in the caller's thread (nothing to
    hand over, nothing to wake), and a call that returned after its deadline counts as cut off
    there: ``TimeoutError``, recorded unknown, what it returned not recorded. A replay
    (``__call__``) goes to a call thread, as ``_OnCallThread``'s does."""

    __slots__ = ()

    def within(self, key: str, left_s: float) -> Any:
        started = time.monotonic()
        # The caller's loop runs under this call, blocked in it. The call must find no loop
        # running, as in a call thread: a client that runs one of its own (``asyncio.run``, a
        # returned coroutine) would refuse to start beside it. Nothing else runs on that loop
        # (see ``_OwnLoop``), so nothing notices its absence meanwhile.
        running = asyncio.events._get_running_loop()
        try:
            asyncio.events._set_running_loop(None)
            # A Ctrl-C raises at once, inside the call, as it does while the caller waits for a call thread.
            _LOOPS.waiting_for_call = True
            value, exc = _called(self.call, self.context, key)
        finally:
            asyncio.events._set_running_loop(running)  # first: the ledger's own writes need it
            _LOOPS.waiting_for_call = False
        if exc is not None and not isinstance(exc, Exception):
            raise CallExited(exc)  # recorded unknown; its caller gets it back (``_for_the_caller``)
        if time.monotonic() - started > left_s:
            raise TimeoutError("the call returned after its deadline") from exc
        if exc is None:
            return value
        raise exc


def _called(call: Callable[[str], Any], context: contextvars.Context, key: str) -> tuple[Any, BaseException | None]:
    """``call(key)`` in the caller's context variables: (its value, None) or (None, what it raised)."""
    try:
        # A copy per run: a replay of the key and a later attempt may use the same context.
        value = context.copy().run(call, key)
        if inspect.isawaitable(value):  # a lambda that returned a coroutine: run it here
            # On a loop of its own that is never the thread's current one (``asyncio.run`` would
            # unset the current loop of a caller's thread after it, with ``inline_calls``).
            with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
                value = runner.run(_awaited(value))
        return value, None
    except BaseException as e:
        return None, e


class _OneCore:
    """The caller's thread kept on the CPU it runs on while it waits for its call (Linux), and the
    call's thread woken there (``_CallThreads.run``): one of the two sleeps while the other runs,
    and a hand-off on one core is a context switch, where one to the other core wakes that core
    from idle (on a virtual machine, a trip through the hypervisor) and runs on caches warmed
    elsewhere. ``make bench`` measured the sync path at about 2x ``Ledger.execute`` without it and
    1.3x with it. Nothing stays pinned: the call's thread takes the caller's own mask back as soon
    as it wakes, before the call runs (a thread or a process the call starts inherits that mask, not
    one CPU; a running thread is not moved when its mask widens), and the caller gets its own mask
    back once the answer is in, whatever ends the wait. A thread that cannot be pinned (another
    OS, a CPU set that refuses) hands off as before.

    Made before the wait and ``leave``-d in its ``finally``: ``pinned`` is set before the mask is,
    so an interruption right after the system call still finds it to undo."""

    __slots__ = ("cpu", "mask", "pinned")

    def __init__(self) -> None:
        self.cpu: int | None = None
        self.mask: set[int] | None = None  # the caller's own mask
        self.pinned = False

    def enter(self) -> None:
        cpu = _this_cpu()
        if cpu is None:
            return
        try:
            mask = os.sched_getaffinity(0)
        except OSError:
            return
        self.cpu, self.mask = cpu, mask
        if mask == {cpu}:
            return  # pinned there already, by the application
        self.pinned = True
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            self.pinned = False

    def leave(self) -> None:
        if self.pinned and self.mask is not None:
            self.pinned = False
            try:
                os.sched_setaffinity(0, self.mask)
            except OSError:  # a CPU of it went away meanwhile (hotplug, a cgroup's cpuset): the kernel's choice stands
                pass


@functools.cache
def _sched_getcpu() -> Callable[[], int] | None:
    """libc's ``sched_getcpu`` (Linux), or None where there is none to call."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    import ctypes  # here, not at import: only a hand-off to a call thread needs it

    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn  # type: ignore[no-any-return]


def _this_cpu() -> int | None:
    """The CPU this thread runs on, or None when it cannot be told."""
    getcpu = _sched_getcpu()  # made on first use
    if getcpu is None:
        return None
    cpu = getcpu()
    return cpu if cpu >= 0 else None


#: What a call thread's inbox holds: the job, the name the thread takes, and the mask it takes back
#: when it wakes (``_OneCore``), or None to close.
_Item = tuple[Callable[[], None], str, set[int] | None] | None


class _Inbox(queue.SimpleQueue[_Item]):
    """A call thread's inbox, with the thread's id."""

    tid: int | None = None

    def send_to(self, cpu: int) -> bool:
        """Wake this inbox's thread on ``cpu`` (``_OneCore``); False when it cannot be."""
        if self.tid is None:
            return False
        try:
            os.sched_setaffinity(self.tid, {cpu})
        except OSError:  # the thread ended meanwhile, or the CPU may not be used: it runs where it may
            return False
        return True


class _CallThreads:
    """The daemon threads that run sync calls, kept between calls. A thread runs one call at a
    time and goes back to the idle ones when its call returns, however late: a call that hangs
    holds only its own thread, and a new one is started while none is idle. Idle threads end after
    ``IDLE_S`` or when the ledger closes, and at most ``MAX_IDLE`` wait: a burst of calls leaves
    no crowd behind. A thread is named after the call it runs, and ``IDLE_NAME`` between calls."""

    IDLE_S = 30.0
    MAX_IDLE = 16
    IDLE_NAME = "effect-ledger idle call thread"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Inbox] = []
        self._closed = False

    def run(self, job: Callable[[], None], name: str, core: _OneCore | None = None) -> None:
        """Run ``job`` in an idle call thread (a new one if none is); woken on the caller's CPU
        when ``core`` pinned the caller there."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            mask = None
            # Before the wake-up, which then happens on that CPU; the thread widens it back first thing.
            if core is not None and core.pinned and core.cpu is not None and inbox.send_to(core.cpu):
                mask = core.mask
            inbox.put((job, name, mask))
            return
        inbox = _Inbox()
        # Started from the caller's thread, it inherits the caller's mask of the moment: one CPU
        # while the caller waits pinned. It takes the caller's own mask before the call runs.
        inbox.put((job, name, core.mask if core is not None and core.pinned else None))
        thread = threading.Thread(target=self._serve, args=(inbox,), name=name, daemon=True)
        thread.start()
        inbox.tid = thread.native_id

    def _serve(self, inbox: _Inbox) -> None:
        me = threading.current_thread()
        while True:
            try:
                item = inbox.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if inbox not in self._idle:
                        continue  # handed a job just now: it is in the inbox
                    self._idle.remove(inbox)
                return
            if item is None:
                return
            job, me.name, mask = item
            if mask is not None:  # woken on the caller's CPU: the call runs with the caller's own mask
                try:
                    os.sched_setaffinity(0, mask)
                except OSError:  # a CPU of it went away meanwhile: the call runs where it is
                    pass
            job()  # never raises: ``run`` in ``_in_thread`` catches everything
            me.name = self.IDLE_NAME
            with self._lock:
                if self._closed or len(self._idle) >= self.MAX_IDLE:
                    return
                self._idle.append(inbox)

    def close(self) -> None:
        """End the idle threads; a thread still in a call ends when the call returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


async def _awaited(value: Any) -> Any:
    return await value


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
