"""What the services say: one logging setup for every ``effects`` service (worker, run, reconcile,
sink, relay), in plain text or JSON lines, on stderr.

Each service logs one ``start`` line (what it serves and where), one line per notable event
(``partitions_assigned``, ``partitions_revoked``, ``uncertain``, ``verdict``, ``escalated``) and a
``summary`` line every ``--log-summary`` seconds with what it counted since the last one. Each line
carries its fields as ``extra`` of the log record: the JSON form prints them as keys, the text form
as ``key=value`` after the sentence (docs/guides/observability.md lists them).

Group coordinator warnings that every consumer meets while a broker or its group coordinator is
starting (``COORDINATOR_NOT_AVAILABLE``, ``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS`` and
aiokafka's ``CoordinatorNotAvailableError`` / ``NotCoordinatorForGroupError`` /
``CoordinatorLoadInProgressError``) are retried by the clients themselves and are not errors of the
service: they are downgraded to INFO (shown with ``-v`` only), so an on-call engineer does not read
a healthy start as a failing one.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

LOG_FORMATS = ("text", "json")
#: Seconds between two summary lines unless ``--log-summary`` says otherwise.
DEFAULT_SUMMARY_S = 60.0

# The attributes every LogRecord has: anything else on a record came through ``extra``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName", "service"}

_COORDINATOR = re.compile(
    r"COORDINATOR_NOT_AVAILABLE|NOT_COORDINATOR|COORDINATOR_LOAD_IN_PROGRESS|Not coordinator|"
    r"[Cc]oordinator (?:not available|load in progress)|CoordinatorNotAvailable|NotCoordinatorForGroup|"
    r"CoordinatorLoadInProgress|GroupCoordinatorNotAvailable",
)
_NOTE = " [normal while a group coordinator starts; the client retries: shown as INFO]"


def is_coordinator_noise(text: str) -> bool:
    """True for a client's message about a group coordinator that is not there yet."""
    return _COORDINATOR.search(text) is not None


class CoordinatorNoise(logging.Filter):
    """Downgrades the clients' start-up coordinator warnings and errors to INFO (see the module
    docstring), and drops them unless their logger is set to show INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.INFO or record.name.startswith("effect_ledger.metrics"):
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the formatter's to report, not the filter's
            return True
        if not is_coordinator_noise(text):
            return True
        record.msg, record.args = text + _NOTE, None
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of a record."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class TextFormatter(logging.Formatter):
    """``2026-12-05T18:40:01.123Z INFO worker: the sentence  key=value ...`` for people."""

    def format(self, record: logging.LogRecord) -> str:
        service = getattr(record, "service", None) or record.name
        extra = fields_of(record)
        extra.pop("event", None)
        line = f"{_iso(record.created)} {record.levelname} {service}: {record.getMessage()}"
        if extra:
            line += "  " + " ".join(f"{k}={_plain(v)}" for k, v in extra.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _plain(v: Any) -> str:
    if isinstance(v, Mapping):
        return ",".join(f"{k}:{x}" for k, x in v.items()) or "-"
    if isinstance(v, list | tuple | set | frozenset):
        return ",".join(str(x) for x in v) or "-"
    s = str(v)
    return json.dumps(s) if (" " in s or not s) else s


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``service``, ``logger``, ``event``, ``msg`` and
    the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "service": getattr(record, "service", None),
            "logger": record.name,
            "event": getattr(record, "event", None) or "log",
            "msg": record.getMessage(),
        }
        for k, v in fields_of(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class _Service(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.name_ = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "service"):
            record.service = self.name_ or None
        return True


_handler: logging.Handler | None = None
_service = _Service()


def setup(fmt: str = "text", *, verbose: bool = False, stream: TextIO | None = None) -> None:
    """The one logging configuration of the ``effects`` command: a stderr handler in ``fmt``
    ("text" or "json") on the root logger, the coordinator filter on it. Commands that are not
    services log warnings only; ``service`` raises effect-ledger's own loggers to INFO."""
    global _handler
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(CoordinatorNoise())
    handler.addFilter(_service)
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    _handler = handler


def service(name: str) -> None:
    """This process is the service ``name``: its lines carry it, and effect-ledger's loggers say
    what they do (INFO)."""
    from effect_ledger.streams.config import send_client_logs_to

    _service.name_ = name
    logging.getLogger("effect_ledger").setLevel(logging.INFO)
    # librdkafka writes to stderr by itself, in its own format, a coordinator that is still loading
    # as a warning: through this logger it gets the service's format and the coordinator filter.
    send_client_logs_to(logging.getLogger("librdkafka"))


def started(log: logging.Logger, what: str, **fields: Any) -> None:
    """The one start line of a service."""
    log.info("started: %s", what, extra={"event": "start", **fields})


def event(log: logging.Logger, name: str, message: str, **fields: Any) -> None:
    """One notable event (``name``: partitions_assigned, uncertain, verdict, escalated, ...)."""
    log.info(message, extra={"event": name, **fields})


class Summary:
    """Counts since the last summary line; ``tick`` logs one once ``every`` seconds have passed
    (``every`` <= 0: never). Safe from several threads: the relay's delivery reports count from
    librdkafka's thread."""

    def __init__(self, log: logging.Logger, every: float = DEFAULT_SUMMARY_S, clock: Any = time.monotonic) -> None:
        self.log = log
        self.every = every
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._since = clock()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def tick(self, **gauges: Any) -> bool:
        """Log the summary when it is due; True when it did. ``gauges``: values of now to add."""
        if self.every <= 0 or self.clock() - self._since < self.every:
            return False
        self.emit(**gauges)
        return True

    def emit(self, **gauges: Any) -> None:
        """Log the summary now (also at a service's end) and start counting afresh."""
        with self._lock:
            counts, self._counts = self._counts, {}
            now = self.clock()
            seconds, self._since = now - self._since, now
        said = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing new"
        self.log.info(
            "summary of the last %.0f s: %s",
            seconds,
            said,
            extra={"event": "summary", "seconds": round(seconds, 1), "counts": counts, **gauges},
        )
