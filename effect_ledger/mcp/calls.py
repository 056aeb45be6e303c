"""One write tool call through the ledger: intent before forwarding, receipt after.

The agent's ``tools/call`` is forwarded with ``_meta.idempotencyKey`` set to the effect's key. What
the agent gets back:

* the server's result, with ``_meta["effect-ledger/effect"]`` saying which effect recorded it and
  whether the server was called now (``called``) or the result came from the record;
* for a call retried after a crash: the recorded result, or what the lookup tool found, or, for a
  server that honours keys, the server's own replay — never a second execution;
* ``isError: true`` with an explanation (effect id, state, what to do) when the outcome is unknown,
  in progress elsewhere, closed by a person, or when the key was reused with other arguments.

Classification of the server's answer: a result is OK; ``isError: true`` is "nothing happened"
(FAILED, a later call may execute) unless the tool is declared ``tool_errors = "uncertain"``; an
``input_required`` result is "not executed yet"; JSON-RPC errors -32700/-32600/-32601/-32602 are
refusals (FAILED); any other error, a lost connection or the deadline leave it UNCERTAIN.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from effect_ledger.core.keys import canonical_json, effect_key
from effect_ledger.core.reconcile import Absent, Answer, EffectView, Found, Unknown
from effect_ledger.errors import (
    DefiniteFailure,
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectUncertain,
    InvalidEffect,
    LedgerError,
)
from effect_ledger.mcp.policy import (
    KEY_META,
    CallIdentity,
    Policy,
    WriteTool,
    call_identity,
    window_identity,
    windowed,
)
from effect_ledger.mcp.wire import INVALID_REQUEST, Upstream, error_response, result_response
from effect_ledger.metrics import tracing
from effect_ledger.sdk.ledger import Confirmation, Ledger

EFFECT_META = "effect-ledger/effect"  # on every result of a recorded call
MAX_RECORDED_BYTES = 1 << 20  # a larger result is returned live, and recorded as a note
_REFUSALS = frozenset({-32700, -32600, -32601, -32602})
_RESERVED_META = "io.modelcontextprotocol/"


@dataclass(frozen=True)
class _Call:
    upstream: Upstream
    reserved_meta: dict[str, Any]  # protocol keys a modern request must carry; copied to lookups


_CURRENT: contextvars.ContextVar[_Call] = contextvars.ContextVar("effect_ledger_mcp_call")


class ToolRefused(DefiniteFailure):
    """The server refused or failed the call and nothing happened: its response goes back as is."""

    def __init__(self, response: dict[str, Any], why: str) -> None:
        super().__init__(why)
        self.response = response


class ToolErrorUncertain(Exception):
    """An ``isError`` result of a tool declared ``tool_errors = "uncertain"``."""


class WriteCalls:
    """Handles the ``tools/call`` requests of write tools for one proxy (every session)."""

    def __init__(self, ledger: Ledger, policy: Policy) -> None:
        self.ledger = ledger
        self.policy = policy
        _install_lookups(ledger, policy)

    def is_write_call(self, msg: Any) -> bool:
        """Is ``msg`` a ``tools/call`` request of a declared write tool (recorded, not passed through)?"""
        if not isinstance(msg, dict):
            return False
        params = msg.get("params")
        return (
            msg.get("method") == "tools/call"
            and "id" in msg
            and isinstance(params, dict)
            and self.policy.write(params.get("name")) is not None
        )

    async def handle(self, msg: dict[str, Any], upstream: Upstream, session_run: str) -> dict[str, Any]:
        """The response to the agent's ``tools/call`` request ``msg`` of a declared write tool."""
        rid = msg.get("id")
        params = msg.get("params")
        write = self.policy.write(params.get("name") if isinstance(params, dict) else None)
        assert isinstance(params, dict) and write is not None
        arguments = params.get("arguments") or {}
        meta = params.get("_meta") or {}
        if not isinstance(arguments, dict) or not isinstance(meta, dict):
            return error_response(rid, -32602, "tools/call: arguments and _meta must be objects")
        if params.get("task") is not None:
            return error_response(
                rid, -32602, f"effect-ledger: {write.tool} is a recorded write; call it without 'task'"
            )
        try:
            ident = call_identity(write, arguments, meta, self.policy.run_id or session_run)
        except InvalidEffect as e:
            return error_response(rid, -32602, f"effect-ledger: {e}")
        if windowed(write, meta, self.policy.run_id):
            try:
                ident = await self._in_window(write, ident)
            except LedgerError as e:  # the ledger cannot say which effect it is: nothing is sent
                return result_response(rid, _explain(write, e))

        live: dict[str, Any] = {}

        async def call(key: str) -> Any:
            forwarded = {**params, "_meta": {**meta, KEY_META: key}}
            live["result"] = _classify(await upstream.request("tools/call", forwarded, rid), write)
            return _bounded(live["result"])  # what the ledger records

        reserved = {k: v for k, v in meta.items() if k.startswith(_RESERVED_META)}
        token = _CURRENT.set(_Call(upstream, reserved))
        try:
            # An MCP tools/call is an agent's tool call: its attempt's span carries the GenAI tool
            # attributes, with the JSON-RPC request id as the call's id.
            with tracing.tool_call(write.tool, None if rid is None else str(rid)):
                confirmation = await self.ledger.execute(
                    target=write.target,
                    operation=write.operation,
                    request={"tool": write.tool, "arguments": arguments},
                    call=call,
                    run_id=ident.run_id,
                    step=ident.step,
                    key=ident.key,
                    timeout=write.timeout_s,
                )
        except ToolRefused as e:
            return {**e.response, "id": rid}
        except LedgerError as e:
            return result_response(rid, _explain(write, e))
        finally:
            _CURRENT.reset(token)
        if not confirmation.called and (refused := await upstream.refuses_caller()) is not None:
            return error_response(rid, INVALID_REQUEST, f"effect-ledger: {refused}")  # not another's result
        # Called now: the agent gets the whole live result, even when the record had to be cut.
        value = live["result"] if confirmation.called and "result" in live else confirmation.value
        return result_response(rid, _annotate(confirmation, value, ident.source))

    async def _in_window(self, write: WriteTool, ident: CallIdentity) -> CallIdentity:
        """The identity of a call known only by its arguments: the first generation
        (``window_identity``) whose effect does not exist or began within the tool's repeat window.
        The generations that began before the window form a prefix (each is used only after the one
        before it aged out), so it is found by galloping and bisecting: a few ledger reads."""
        window_ms = int(write.repeat_window_s * 1000)

        async def aged_out(generation: int) -> bool:
            cand = window_identity(ident, generation)
            assert cand.run_id is not None and cand.step is not None
            key = effect_key(write.target, write.operation, cand.run_id, cand.step, self.ledger.namespace)
            effect = await self.ledger.get(key)
            if effect is None or effect.first_intent is None:
                return False
            # When the log took its first intent, not a writer's claim of it (DESIGN: time is data).
            return self.ledger.now_ms() - effect.log_time(effect.first_intent) > window_ms

        if not await aged_out(0):
            return window_identity(ident, 0)
        low, high = 0, 1
        while await aged_out(high):
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if await aged_out(mid) else (low, mid)
        return window_identity(ident, high)


def _classify(response: dict[str, Any], write: WriteTool) -> dict[str, Any]:
    if "error" in response:
        err = response.get("error") or {}
        code = err.get("code") if isinstance(err, dict) else None
        if code in _REFUSALS:
            raise ToolRefused(response, f"refused by the server ({code}): {err.get('message')}")
        raise ConnectionError(f"server error {code}: {err.get('message') if isinstance(err, dict) else err}")
    result = response.get("result")
    if not isinstance(result, dict):
        raise ConnectionError("the server answered tools/call without a result object")
    if result.get("resultType") == "input_required":
        raise ToolRefused(response, "the server needs input first: not executed yet")
    if result.get("isError") is True:
        text = _text_of(result)
        if write.tool_errors == "uncertain":
            raise ToolErrorUncertain(f"the tool reported an error: {text}")
        raise ToolRefused(response, f"the tool reported an error: {text}")
    return result


def _bounded(result: dict[str, Any]) -> dict[str, Any]:
    """What the ledger records of a result; the agent still gets the whole result on this call."""
    size = len(canonical_json(result).encode())
    if size <= MAX_RECORDED_BYTES:
        return result
    note = f"the original result ({size} bytes) was over the record limit of {MAX_RECORDED_BYTES} bytes"
    return {"content": [{"type": "text", "text": note}], "_meta": {EFFECT_META: {"truncated": size}}}


def _annotate(confirmation: Confirmation, value: Any, key_from: str) -> dict[str, Any]:
    result = as_tool_result(value)
    meta = dict(result.get("_meta") or {})
    meta[EFFECT_META] = {
        "id": confirmation.effect_id,
        "called": confirmation.called,
        "source": confirmation.source.value,
        "keyFrom": key_from,
    }
    # 2026-07-28 requires resultType on every result; older peers ignore it.
    return {"resultType": "complete", **result, "_meta": meta}


def as_tool_result(value: Any) -> dict[str, Any]:
    """A recorded value as a ``CallToolResult``: as is when it is one, else its JSON as text (and
    as ``structuredContent`` when it is an object)."""
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        return value
    if value is None:
        return {"content": [{"type": "text", "text": "recorded as done (no result was recorded)"}]}
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


def _explain(write: WriteTool, e: LedgerError) -> dict[str, Any]:
    """An ``isError`` result that tells the agent (and the person reading its transcript) what the
    ledger knows and what to do; the server was not called by this request unless it says so."""
    effect_id = getattr(e, "effect_id", None)
    state = getattr(e, "state", None)
    if isinstance(e, EffectUncertain):
        text = (
            f"effect-ledger: the outcome of '{write.tool}' is unknown: effect {effect_id} is {state} ({e.reason}). "
            "The server was not called again, since a second call could execute it twice. "
            f"Someone who can check must record what happened: effects resolve {effect_id} "
            "--confirmed|--absent --by NAME --reason TEXT. Then retry this same call (same arguments "
            "and _meta): it returns the result, or executes once."
        )
    elif isinstance(e, EffectInProgress):
        state = "IN_PROGRESS"
        after = f" Retry in {e.retry_after_ms / 1000:.1f} s." if e.retry_after_ms else " Retry later."
        text = f"effect-ledger: '{write.tool}' is already in progress: {e}.{after}"
    elif isinstance(e, EffectClosed):
        text = f"effect-ledger: '{write.tool}' was closed by a person and will not be executed: {e}."
    elif isinstance(e, EffectConflict):
        state = "CONFLICT"
        text = (
            f"effect-ledger: {e}. A retry must repeat the same arguments; a new call needs a new "
            "_meta['effect-ledger/stepId'] or idempotencyKey."
        )
    else:
        text = f"effect-ledger: '{write.tool}' was not sent to the server: {type(e).__name__}: {e}"
    detail = {"id": effect_id, "state": state, "error": type(e).__name__}
    return {
        "content": [{"type": "text", "text": text}],
        "isError": True,
        "resultType": "complete",
        "_meta": {EFFECT_META: detail},
    }


def _text_of(result: Mapping[str, Any]) -> str:
    parts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict)]
    return " ".join(p for p in parts if isinstance(p, str))[:500] or "(no text)"


class LookupToolReconciler:
    """Asks the server, through a declared lookup tool, whether a write happened.

    The lookup tool is called with ``{lookup_argument: KEY}`` (default ``idempotencyKey``). Its
    ``structuredContent`` answers: ``found: true`` -> CONFIRMED (``id``: the receipt id, optional;
    ``result``: the write's original ``CallToolResult``, returned to the agent, optional, else the
    structured content is); ``found: false`` -> absent (a retry is safe once the call's deadline has
    passed); an ``isError`` result, an error or no boolean ``found`` -> unknown (asked again later).
    Only the proxy can call it: from anywhere else the answer is unknown.
    """

    def __init__(self, writes: list[WriteTool], fallback: Any = None) -> None:
        self.name = "mcp-lookup-tool"
        self._by_operation = {w.operation: w for w in writes if w.lookup_tool}
        self._fallback = fallback

    async def check(self, effect: EffectView) -> Answer:
        """Found / Absent / Unknown, from the write's lookup tool."""
        write = self._by_operation.get(effect.operation)
        if write is None or write.lookup_tool is None:
            if self._fallback is not None:
                answer: Answer = await self._fallback.check(effect)
                return answer
            return Unknown(f"no lookup tool is declared for {effect.operation!r}")
        current = _CURRENT.get(None)
        if current is None:
            return Unknown(f"only effects mcp-proxy, connected to the server, can call {write.lookup_tool!r}")
        params = {
            "name": write.lookup_tool,
            "arguments": {write.lookup_argument: effect.effect_id},
            "_meta": dict(current.reserved_meta),
        }
        return lookup_answer(write, await current.upstream.request("tools/call", params))


def lookup_answer(write: WriteTool, response: dict[str, Any]) -> Answer:
    """The reconciler's answer for a lookup tool's response (the mapping documented above)."""
    lookup = write.lookup_tool
    if "error" in response:
        return Unknown(f"lookup tool {lookup!r} failed: {response.get('error')}")
    result = response.get("result")
    if not isinstance(result, dict) or result.get("isError") is True:
        return Unknown(f"lookup tool {lookup!r} reported an error: {_text_of(result or {})}")
    sc = result.get("structuredContent")
    found = sc.get("found") if isinstance(sc, dict) else None
    if found is False:
        return Absent(f"lookup tool {lookup!r} found no call with this key")
    if found is not True or not isinstance(sc, dict):
        return Unknown(f"lookup tool {lookup!r} answered without a boolean 'found' in structuredContent")
    original = sc.get("result")
    if isinstance(original, dict) and isinstance(original.get("content"), list):
        value: Any = original
    else:
        value = sc.get("record", sc)
    receipt = sc.get("id")
    return Found(str(receipt) if receipt is not None else f"{lookup}:found", as_tool_result(value))


def _install_lookups(ledger: Ledger, policy: Policy) -> None:
    """Targets with lookup tools are asked through them (their declared reconciler answers for the
    write tools without one)."""
    by_target: dict[str, list[WriteTool]] = {}
    for w in policy.writes.values():
        ledger.target(w.target)  # undeclared: UnknownTarget before anything runs
        if w.lookup_tool:
            by_target.setdefault(w.target, []).append(w)
    for name, writes in by_target.items():
        t = ledger.target(name)
        ledger.register(replace(t, reconciler=LookupToolReconciler(writes, fallback=t.reconciler)))
