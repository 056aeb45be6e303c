"""``effects assess LEDGER.db``: the same eight rows from an embedded ledger's own file, so a team can
compare its log before adoption with the ledger after it.

Each attempt is an intent (``target.operation`` is the tool, the effect id the key when the intent
says it was handed to the destination, the request digest the arguments), ended by its ``Executed``
(the call's own start and end, OK, FAILED or UNKNOWN), made unknown by a ``Timeout`` without one, or
left started. Memory: the attempts not ended yet.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator

from effect_ledger.core.assess import MAX_TRACKED, Assessor, Call, Carries, Status
from effect_ledger.core.model import Executed, Intent, Outcome, Timeout
from effect_ledger.errors import AssessError
from effect_ledger.ops.assess import Result
from effect_ledger.ops.sources import Replayed, SourceError, db_events

SQLITE_MAGIC = b"SQLite format 3\x00"
_STATUS: dict[Outcome, Status] = {Outcome.OK: "ok", Outcome.FAILED: "error", Outcome.UNKNOWN: "unknown"}


def is_ledger_file(path: str) -> bool:
    """Whether ``path`` is an SQLite file (the ledger's own; anything else is read as JSON lines)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a FIFO would block the open; the log reader refuses it with its own message
        with open(path, "rb") as fp:
            return fp.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def ledger_calls(replayed: Iterable[Replayed]) -> Iterator[Call]:
    """The attempts of a ledger's events (its file: ``db_events``; its topics: ``replay_events``),
    each when it ends (started ones at the end)."""
    open_: dict[tuple[str, int], tuple[Intent, bool]] = {}  # (effect, attempt) -> (intent, timed out)
    n = 0
    try:
        for r in replayed:
            e = r.event
            n += 1
            if isinstance(e, Intent):
                open_[(e.effect_id, e.attempt)] = (e, False)
            elif isinstance(e, Executed):
                got = open_.pop((e.effect_id, e.attempt), None)
                if got is not None:
                    yield _call(got[0], e.call_started_ms, e.call_ended_ms, _STATUS[e.outcome], n)
            elif isinstance(e, Timeout) and (e.effect_id, e.attempt) in open_:
                open_[(e.effect_id, e.attempt)] = (open_[(e.effect_id, e.attempt)][0], True)
    except SourceError as err:
        raise AssessError(str(err)) from None
    for intent, timed_out in open_.values():
        yield _call(intent, intent.at_ms, None, "unknown" if timed_out else "pending", n)


def _call(i: Intent, start: int, end: int | None, status: Status, line: int) -> Call:
    return Call(f"{i.target}.{i.operation}", start, end, status, True, i.effect_id if i.keyed else None,
                i.request_digest, i.effect_id, i.at_ms, line)  # fmt: skip


def assess_ledger(
    source: str | Iterable[Replayed], *, writes: Iterable[str] = (), window_s: float = 600.0, tracked: int = MAX_TRACKED
) -> Result:
    """Assess a ledger: an embedded ledger file's path, or replayed events (its Kafka topics);
    ``writes``: the ``target.operation`` tools that are writes [all]."""
    named = frozenset(writes)
    a = Assessor(window_ms=int(window_s * 1000), tracked=tracked)
    a.carries = Carries(keys=True, args=True, ends=True, pending=True, intents=True)
    result = Result("ledger", a)
    for c in ledger_calls(db_events(source) if isinstance(source, str) else source):
        a.add(c if not named or c.tool in named else c._replace(write=False))
        result.lines += 1
    a.finish()
    return result
