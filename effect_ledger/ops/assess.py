"""``effects assess LOG``: the eight-row check of an execution log a team already has.

Reads the log once, streamed (:func:`read_lines`: lines up to :data:`MAX_LINE_BYTES`, at most
``max_bytes`` in all), detects its format from the first record (or takes ``fmt``), turns each record
into calls (``effect_ledger.ops.assess_formats``) and folds them in the pure
:class:`effect_ledger.core.assess.Assessor`. Bad lines (not JSON, not an object, no tool, too long)
are counted by reason, never fatal. With ``redact_to``, every line read is written there redacted
(``effect_ledger.ops.assess_report.redact``) in the same pass.

Memory: one line at a time, plus the assessor's bounded tracking (``MAX_TRACKED`` identities,
``MAX_SAMPLES`` durations per series; see ``effect_ledger.core.assess``).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from effect_ledger.core.assess import MAX_TRACKED, Assessor, Call, Carries, Costs, arithmetic, rows
from effect_ledger.errors import AssessError
from effect_ledger.ops.assess_formats import FIELDS, FORMATS, PREFILTER, READERS, Context, detect


def _json_loads() -> Callable[[bytes], Any]:
    """orjson parses JSON lines about twice as fast; the stdlib is the fallback (orjson is optional)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - where the [assess] extra is absent
        import json

        return json.loads
    return orjson.loads


_loads = _json_loads()

__all__ = ["AssessError", "FIELDS", "FORMATS", "MAX_LINE_BYTES", "MAX_LOG_BYTES", "Result", "assess", "read_lines"]

#: The longest line read: an OTLP file exporter writes a whole export batch on one line.
MAX_LINE_BYTES = 16 << 20
#: What one run reads at most (about ten minutes at the measured speed): a wrong LOG (a device, ``-``
#: fed an endless stream) ends with an error instead of running, and growing, for ever.
MAX_LOG_BYTES = 64 << 30
_EXAMPLES = 5


def field_paths(overrides: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The paths of each field of the calls layout, with ``NAME=PATH`` overrides tried first."""
    paths = dict(FIELDS)
    for spec in overrides:
        name, sep, path = spec.partition("=")
        if not sep or not path or name not in FIELDS:
            raise AssessError(f"--field {spec!r}: expected NAME=PATH with NAME one of {', '.join(FIELDS)}")
        paths[name] = (path, *paths[name])
    return paths


def read_lines(
    fp: BinaryIO,
    limit: int = MAX_LINE_BYTES,
    max_bytes: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[bytes | None]:
    """The lines of a binary file; ``None`` for a line over ``limit`` bytes (never held whole).
    ``AssessError`` once more than ``max_bytes`` bytes (default ``MAX_LOG_BYTES``) were read;
    ``progress`` gets the bytes read so far after each chunk."""
    if max_bytes is None:
        max_bytes = MAX_LOG_BYTES
    buf = bytearray()
    skipping = False
    total = 0
    while chunk := fp.read(1 << 20):
        total += len(chunk)
        if total > max_bytes:
            raise AssessError(f"more than {max_bytes} bytes: assess a part of the log (head -c {max_bytes} LOG | ...)")
        if progress is not None:
            progress(total)
        start = 0
        if buf or skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                if not skipping:
                    buf += chunk
                    if len(buf) > limit:
                        buf.clear()
                        skipping = True
                continue
            if skipping or len(buf) + nl > limit:
                yield None
            else:
                yield bytes(buf + chunk[:nl])
            buf.clear()
            skipping = False
            start = nl + 1
        last = chunk.rfind(b"\n")
        if last >= start:
            # whole lines of the chunk: split at C speed, check the bound per line
            for line in chunk[start:last].split(b"\n"):
                yield line if len(line) <= limit else None
            start = last + 1
        rest = chunk[start:]
        if len(rest) > limit:
            skipping = True
        else:
            buf += rest
    if skipping:
        yield None
    elif buf:
        yield bytes(buf)


@dataclass
class Result:
    """An assessment: the format read, the line counts and the folded calls."""

    format: str | None
    assessor: Assessor
    lines: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0

    def as_dict(self, costs: Costs, show_values: bool = False) -> dict[str, Any]:
        """The report as JSON: the eight rows, the arithmetic, the per-tool breakdown, examples."""
        a = self.assessor
        examples = {
            kind: [e if show_values else {k: v for k, v in e.items() if k != "key"} for e in ex]
            for kind, ex in a.examples.items()
        }
        return {
            "format": self.format,
            "lines": self.lines,
            "bad_lines": {"count": sum(self.bad.values()), "by_reason": dict(self.bad), "examples": self.bad_examples},
            "records_not_tool_calls": self.skipped,
            "window_s": a.window_ms / 1000,
            "log_days": a.span_days,
            "rows": [r.as_dict() for r in rows(a)],
            "arithmetic": arithmetic(a, costs),
            "tools": [t.as_dict() for t in sorted(a.tools.values(), key=lambda t: (-t.writes, t.tool))],
            "examples": examples,
            "forgotten_identities": a.forgotten,
        }


def assess(
    lines: Iterable[bytes | None],
    *,
    fmt: str | None = None,
    paths: dict[str, tuple[str, ...]] | None = None,
    writes: Iterable[str] = (),
    window_s: float = 600.0,
    tracked: int = MAX_TRACKED,
    redact_to: Callable[[bytes | None, Any], None] | None = None,
    parallel: bool = False,
) -> Result:
    """Assess the log ``lines`` (bytes, with or without the newline; ``None``: a line too long).

    ``fmt`` forces a format (one of :data:`FORMATS`); otherwise the first JSON object decides.
    ``redact_to(raw, parsed)`` sees every line (parsed is ``None`` when it is not JSON).

    ``parallel``: read and parse ``lines`` in a forked child process while this one folds the calls
    it sends, in order (two cores: about twice the speed on a log of only tool calls). The child runs
    the very code of the sequential path and the fold sees the same calls in the same order, so the
    result is identical. Only where ``fork`` exists (Linux) and without ``redact_to``; else sequential."""
    if fmt is not None and fmt not in FORMATS:
        raise AssessError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    ctx = Context(paths=paths or dict(FIELDS), writes=frozenset(writes))
    a = Assessor(window_ms=int(window_s * 1000), tracked=tracked)
    result = Result(fmt, a)
    if parallel and redact_to is None and sys.platform == "linux":
        _fold_forked(lines, ctx, result)
    else:
        add = a.add
        for call in _calls(lines, ctx, result, redact_to):
            add(call)
    s = ctx.seen
    a.carries = Carries(keys=s.keys, args=s.args, ends=s.ends, pending=s.pending, intents=s.intents)
    a.finish()
    return result


def _calls(
    lines: Iterable[bytes | None],
    ctx: Context,
    result: Result,
    redact_to: Callable[[bytes | None, Any], None] | None = None,
) -> Iterator[Call]:
    """The calls of ``lines`` in log order; the line counts, bad lines, records skipped and the
    format found go to ``result`` (its ``lines`` and ``skipped`` are final once this is exhausted)."""
    fmt = result.format
    reader = READERS[fmt] if fmt else None
    needle = PREFILTER.get(fmt) if fmt else None
    n = 0
    for n, raw in enumerate(lines, 1):  # noqa: B007 - n is the line count afterwards
        ctx.line = n
        if raw is None:
            _bad(result, n, f"longer than {MAX_LINE_BYTES} bytes")
            if redact_to is not None:
                redact_to(None, None)
            continue
        if needle is not None and needle not in raw and redact_to is None:
            result.skipped += 1  # cannot be a tool call of this format: not parsed at all
            continue
        try:
            obj = _loads(raw)
        except ValueError:
            if not raw.strip():  # looked at only here: a copy of every line is not for free
                _bad(result, n, "empty")
                continue
            _bad(result, n, "not JSON")
            if redact_to is not None:
                redact_to(raw, None)
            continue
        if redact_to is not None:
            try:
                redact_to(raw, obj)
            except (ValueError, RecursionError):  # deeper than assess_report.MAX_DEPTH: left out whole
                _bad(result, n, "nested too deep")
                continue
        # one record per line, the usual case, without a generator
        recs = (obj,) if isinstance(obj, dict) and not isinstance(obj.get("data"), list) else _records(obj)
        for rec in recs:
            if reader is None:
                found = detect(rec)
                if found is None:
                    break
                result.format, reader, needle = found, READERS[found], PREFILTER.get(found)
            try:
                # the calls read before a record turns out bad half-way (an OTLP batch) still count
                yield from reader(rec, ctx)
            except ValueError as e:
                _bad(result, n, str(e))
            except (TypeError, AttributeError, KeyError):
                _bad(result, n, f"not a {result.format} record")
            except RecursionError:  # arguments nested deeper than Python recurses (JSON inside JSON)
                _bad(result, n, "nested too deep")
        else:
            continue
        _bad(result, n, "not a JSON object")
    result.lines = n
    result.skipped += ctx.seen.skipped


#: Calls per message from the parsing child: about 200 KB, so a few are in flight at most (memory).
_BATCH = 2048
#: The pipe's buffer: the child writes a batch without waiting for the parent to read it piecewise.
_PIPE_BYTES = 1 << 20


def _fold_forked(lines: Iterable[bytes | None], ctx: Context, result: Result) -> None:
    """Parse in a forked child, fold here: the child sends batches of calls as marshalled tuples
    (several times cheaper than pickling named tuples) over a pipe, whose bounded buffer keeps the
    child at most about a megabyte ahead; then the counts only it saw; or the error that stopped it.

    A bare ``os.fork``, not ``multiprocessing.Process``: that closes standard input in the child,
    which is the log of ``effects assess -``."""
    import fcntl  # here: Unix only, like fork
    from multiprocessing.connection import Connection

    r, w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # Linux: room for a few batches, not 64 KB
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    pid = os.fork()
    if pid == 0:  # the child: parse, send, and leave without running the parent's exit handlers
        code = 1
        try:
            os.close(r)
            _parse_child(lines, ctx, result, Connection(w, readable=False))
            code = 0
        except BaseException:  # a bug: its trace on stderr, the parent says the reading ended
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)  # the child's end only: its death shows here as end of file
    recv = Connection(r, writable=False)
    add, make = result.assessor.add, tuple.__new__
    done = False
    try:
        while True:
            try:
                msg = recv.recv_bytes()
            except EOFError:
                raise AssessError("the reading process ended without a result") from None
            body = marshal.loads(memoryview(msg)[1:])
            tag = msg[:1]
            if tag == b"C":
                for t in body:
                    add(make(Call, t))
                continue
            if tag == b"X":
                kind, text, errno = body
                if kind == "os":
                    raise OSError(errno, text)
                raise AssessError(text)
            fmt, lines_n, bad, examples, skipped, seen = body
            result.format, result.lines, result.skipped = fmt, lines_n, skipped
            result.bad.update(bad)
            result.bad_examples[:] = examples
            for name, v in seen.items():
                setattr(ctx.seen, name, v)
            done = True
            return
    finally:
        recv.close()
        if not done:  # this side failed or was interrupted: the child has nobody to send to
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _parse_child(lines: Iterable[bytes | None], ctx: Context, result: Result, send: Any) -> None:
    try:
        batch: list[tuple[Any, ...]] = []
        for call in _calls(lines, ctx, result):
            batch.append(tuple(call))
            if len(batch) == _BATCH:
                send.send_bytes(b"C" + marshal.dumps(batch))
                batch = []
        if batch:
            send.send_bytes(b"C" + marshal.dumps(batch))
        seen = dict(ctx.seen.__dict__)
        summary = (result.format, result.lines, dict(result.bad), result.bad_examples, result.skipped, seen)
        send.send_bytes(b"E" + marshal.dumps(summary))
    except (BrokenPipeError, KeyboardInterrupt):  # the folding side is gone or interrupted too
        pass
    except AssessError as e:  # more than MAX_LOG_BYTES
        send.send_bytes(b"X" + marshal.dumps(("assess", str(e), 0)))
    except OSError as e:
        send.send_bytes(b"X" + marshal.dumps(("os", e.strerror or str(e), e.errno or 0)))


def _records(obj: Any) -> Iterator[Any]:
    """A record, the elements of an array on one line, or the ``data`` of an API page."""
    if isinstance(obj, list):
        yield from obj
    elif isinstance(obj, dict) and isinstance(obj.get("data"), list) and "resourceSpans" not in obj:
        yield from obj["data"]
    else:
        yield obj


def _bad(result: Result, n: int, reason: str) -> None:
    result.bad[reason] += 1
    if len(result.bad_examples) < _EXAMPLES:
        result.bad_examples.append({"line": n, "reason": reason})
