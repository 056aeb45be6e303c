"""Which MCP tools are writes, and the key rule of a recorded tool call.

Write tools are declared in the targets file, beside the targets they write to, or by flags of
``effects mcp-proxy`` (flags add to the file and win on conflict)::

    [targets.payments]
    lookup = "none"                 # the proxy asks through the lookup tool below
    honours_keys = true             # the server deduplicates _meta.idempotencyKey

    [mcp.writes.refund]             # every tools/call of "refund" is recorded as an effect
    target = "payments"             # a target declared above
    lookup_tool = "find_refund"     # optional: called with {"idempotencyKey": KEY}
    timeout = "60s"                 # optional: the call's deadline (default 60s)
    tool_errors = "failed"          # optional: isError results mean "nothing happened" (or "uncertain")
    repeats = "same-effect"         # optional (the default): without a run id, the same arguments
    repeat_window = "24h"           # within this window are the same effect, across proxy restarts;
                                    # "per-session": each MCP session mints its own keys (unsafe)

The key rule (``call_identity``, and ``window_identity`` for a call that names no run) is pinned by
``tests/unit/mcp/test_mcp_policy.py`` and ``test_mcp_window.py``: NEVER CHANGE IT SILENTLY, a
different rule turns a retried call into a second effect. The default for a call without any run id
is the safe one: the same tool and arguments within the tool's ``repeat_window`` are one effect,
across proxy restarts (``docs/guides/mcp-default-policy.md``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from effect_ledger.core.keys import canonical_json, check_key, check_name, digest
from effect_ledger.core.timeparse import TimeSpecError, duration_ms
from effect_ledger.errors import InvalidEffect, TargetsError

KEY_META = "idempotencyKey"  # the field proposed for MCP idempotency: handed to the server
RUN_META = "effect-ledger/runId"  # the agent's run: the same in every retry of the run
STEP_META = "effect-ledger/stepId"  # the agent's logical step: tells apart two identical calls
DEFAULT_TIMEOUT_S = 60.0
TOOL_ERRORS = ("failed", "uncertain")
# What a call repeated without a run id is: the same effect within the window (the safe default),
# or a new effect in every MCP session (a restarted proxy then executes a retried call again).
REPEATS = ("same-effect", "per-session")
DEFAULT_REPEAT_WINDOW_S = 24 * 3600.0  # as long as a payment API such as Stripe remembers a key
WINDOW_RUN = "effect-ledger/mcp-window"  # the run of a call identified by its arguments and window
_SETTINGS = {
    "target", "operation", "lookup_tool", "lookup_argument", "timeout", "tool_errors", "repeats", "repeat_window",
}  # fmt: skip


@dataclass(frozen=True)
class WriteTool:
    """A tool whose every call is recorded as an effect on ``target``."""

    tool: str
    target: str
    operation: str
    lookup_tool: str | None = None
    lookup_argument: str = KEY_META
    timeout_s: float = DEFAULT_TIMEOUT_S
    tool_errors: str = "failed"
    repeats: str = "same-effect"
    repeat_window_s: float = DEFAULT_REPEAT_WINDOW_S

    def describe(self, run_id: str | None) -> str:
        """The policy this tool runs under, in one line (the proxy says it on stderr at start)."""
        head = f"write tool {self.tool!r} -> target {self.target!r} (operation {self.operation!r}): "
        if run_id is not None:
            return head + f"keys from --run-id {run_id!r} and the arguments (or the agent's own key or step)"
        if self.repeats == "per-session":
            return head + (
                'repeats = "per-session": without a run id each MCP session mints new keys, so a call '
                "retried through a restarted proxy may execute twice"
            )
        return head + (
            f"a call repeating the same arguments within {_span(self.repeat_window_s)} is the same effect, "
            "across proxy restarts, unless the agent sends its own runId, stepId or idempotencyKey"
        )


@dataclass(frozen=True)
class Policy:
    """What the proxy records: the write tools by name, and the run id given on the command line."""

    writes: Mapping[str, WriteTool] = field(default_factory=dict)
    run_id: str | None = None

    def write(self, tool: object) -> WriteTool | None:
        """The declaration of ``tool`` if it is a write, else None (passed through unrecorded)."""
        return self.writes.get(tool) if isinstance(tool, str) else None


@dataclass(frozen=True)
class CallIdentity:
    """How ``Ledger.execute`` is told which logical call this is: its own ``key``, or a
    ``run_id`` and ``step`` the key is derived from."""

    key: str | None
    run_id: str | None
    step: str | None
    source: str  # "agent-key", "agent-step", "arguments" or "arguments-window": said in the proxy's answers


def call_identity(write: WriteTool, arguments: Any, meta: Mapping[str, Any], session_run: str) -> CallIdentity:
    """The key rule of a recorded tool call.

    1. ``_meta.idempotencyKey`` given by the agent: that is the key, as it is.
    2. Otherwise the key is ``effect_key(target, operation, RUN, STEP)`` where
       RUN = ``_meta["effect-ledger/runId"]``, else the proxy's ``--run-id``, else the MCP session
       (``session_run``), and STEP = ``_meta["effect-ledger/stepId"]``, else ``"args:"`` + the
       sha256 of the tool's canonical arguments.

    (When neither the agent nor ``--run-id`` names a run, ``WriteCalls`` replaces the session by the
    tool's repeat window: see ``windowed`` and ``window_identity``.)

    So a retried call (same run, same step or same arguments) gets the same key, and its recorded
    result; a new call gets a new key when its step or its arguments differ. Consequence: two
    calls with identical arguments in one run are ONE call unless the agent gives each its own
    stepId. The same key with other arguments is a conflict, never a second effect.
    """
    given = meta.get(KEY_META)
    if given is not None:
        try:
            return CallIdentity(check_key(given), None, None, "agent-key")
        except InvalidEffect as e:
            raise InvalidEffect(f"_meta.{KEY_META}: {e}") from None
    run = _meta_string(meta, RUN_META) or session_run
    step = _meta_string(meta, STEP_META)
    if step is not None:
        return CallIdentity(None, run, step, "agent-step")
    return CallIdentity(None, run, "args:" + digest(canonical_json(arguments)), "arguments")


def windowed(write: WriteTool, meta: Mapping[str, Any], run_id: str | None) -> bool:
    """Whether a call is identified by its arguments within the tool's repeat window (the safe
    default): the agent sent no key, run or step, the proxy has no ``--run-id``, and the tool is not
    declared ``repeats = "per-session"``. (``call_identity`` would scope such a call to the MCP
    session, which a restarted proxy does not share: a retried call would execute again.)"""
    given = any(meta.get(k) is not None for k in (KEY_META, RUN_META, STEP_META))
    return run_id is None and not given and write.repeats == "same-effect"


def window_identity(ident: CallIdentity, generation: int) -> CallIdentity:
    """The identity of a windowed call (``windowed``) in its ``generation``: run ``WINDOW_RUN``, step
    the arguments' digest, then ``#1``, ``#2``, ... for each later window. The proxy takes the first
    generation whose effect does not exist yet or began within the window (``effect_ledger.mcp.calls``),
    so a repeat within the window finds the same effect, and a call after it a new one. Pinned with
    ``call_identity``: NEVER CHANGE IT SILENTLY."""
    assert ident.step is not None
    step = ident.step if generation == 0 else f"{ident.step}#{generation}"
    return CallIdentity(None, WINDOW_RUN, step, "arguments-window")


def _span(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _meta_string(meta: Mapping[str, Any], name: str) -> str | None:
    value = meta.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise InvalidEffect(f"_meta[{name!r}] must be a non-empty string of at most 1024 characters")
    return value


def load_policy(
    targets_file: str | os.PathLike[str] | None,
    declared: Iterable[str],
    *,
    writes: Iterable[str] = (),
    target: str | None = None,
    lookups: Iterable[str] = (),
    run_id: str | None = None,
) -> Policy:
    """The write tools from the ``[mcp.writes.*]`` tables of ``targets_file`` plus the flags:
    ``writes`` (tool names recorded on ``target``; with one declared target it is the default) and
    ``lookups`` (``TOOL=LOOKUP_TOOL``). ``declared`` names the targets of the file. Raises
    ``TargetsError`` naming what is wrong."""
    names = set(declared)
    found: dict[str, WriteTool] = dict(_from_file(Path(targets_file), names)) if targets_file is not None else {}
    flagged = [w.strip() for w in writes if w.strip()]
    if flagged:
        if target is None:
            if len(names) != 1:
                raise TargetsError(
                    f"--writes needs --target NAME: which declared target the tools write to "
                    f"(declared: {', '.join(sorted(names)) or 'none'})"
                )
            target = next(iter(names))
        if target not in names:
            raise TargetsError(f"--target {target!r} is not declared in the targets file")
        for tool in flagged:
            found[tool] = _write(tool, {"target": target}, names, "--writes")
    for spec in lookups:
        tool, sep, lookup = spec.partition("=")
        if not sep or not tool or not lookup:
            raise TargetsError(f"--lookup-tool {spec!r}: expected TOOL=LOOKUP_TOOL")
        if tool not in found:
            raise TargetsError(f"--lookup-tool {spec!r}: {tool!r} is not declared as a write tool")
        found[tool] = replace(found[tool], lookup_tool=lookup)
    if run_id is not None and not run_id:
        raise TargetsError("--run-id must not be empty")
    return Policy(found, run_id)


def _from_file(path: Path, names: set[str]) -> dict[str, WriteTool]:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TargetsError(f"{path}: cannot read the [mcp] section: {e}") from None
    section = doc.get("mcp", {})
    if not isinstance(section, dict) or set(section) - {"writes"}:
        raise TargetsError(f"{path}: [mcp] holds only [mcp.writes.TOOL] tables")
    tables = section.get("writes", {})
    if not isinstance(tables, dict):
        raise TargetsError(f"{path}: [mcp.writes] must be tables [mcp.writes.TOOL]")
    return {tool: _write(tool, body, names, f"{path}: [mcp.writes.{tool}]") for tool, body in tables.items()}


def _write(tool: str, body: Any, names: set[str], where: str) -> WriteTool:
    if not isinstance(body, dict):
        raise TargetsError(f"{where}: expected a table of settings")
    unknown = set(body) - _SETTINGS
    if unknown:
        raise TargetsError(f"{where}: unknown setting {sorted(unknown)[0]!r} (known: {', '.join(sorted(_SETTINGS))})")
    target = body.get("target")
    if not isinstance(target, str) or target not in names:
        raise TargetsError(f"{where}: target {target!r} is not declared (declared: {', '.join(sorted(names))})")
    operation = body.get("operation", tool)
    try:
        check_name("operation", operation)
    except InvalidEffect as e:
        raise TargetsError(f'{where}: {e}; set operation = "NAME" for this tool') from None
    strings = {k: body[k] for k in ("lookup_tool", "lookup_argument") if k in body}
    for k, v in strings.items():
        if not isinstance(v, str) or not v:
            raise TargetsError(f"{where}: {k} must be a non-empty string")
    errors = body.get("tool_errors", "failed")
    if errors not in TOOL_ERRORS:
        raise TargetsError(f"{where}: tool_errors must be one of {', '.join(TOOL_ERRORS)}")
    repeats = body.get("repeats", "same-effect")
    if repeats not in REPEATS:
        raise TargetsError(f"{where}: repeats must be one of {', '.join(REPEATS)}")
    window_s = DEFAULT_REPEAT_WINDOW_S
    if "repeat_window" in body:
        try:
            window_s = duration_ms(str(body["repeat_window"])) / 1000
        except TimeSpecError as e:
            raise TargetsError(f"{where}: repeat_window: {e}") from None
        if window_s <= 0:
            raise TargetsError(f"{where}: repeat_window must be longer than zero")
    timeout_s = DEFAULT_TIMEOUT_S
    if "timeout" in body:
        try:
            timeout_s = duration_ms(str(body["timeout"])) / 1000
        except TimeSpecError as e:
            raise TargetsError(f"{where}: timeout: {e}") from None
        if timeout_s <= 0:
            raise TargetsError(f"{where}: timeout must be longer than zero")
    return WriteTool(
        tool, target, operation, timeout_s=timeout_s, tool_errors=errors, repeats=repeats, repeat_window_s=window_s,
        **strings,
    )  # fmt: skip
