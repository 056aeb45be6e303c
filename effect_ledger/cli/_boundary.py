"""The ``effects`` command line's error boundary and its validated option types.

Every failure a user can meet ends the same way: one line on stderr, ``effects: <what went wrong>``,
and exit status 1. That holds for a usage error (a missing or malformed option), a typed
``LedgerError``, a file that is not a ledger or is damaged, a missing folder, a broker that does not
answer, and for anything unexpected too (with ``-v`` an unexpected error also prints its traceback,
for a bug report). Statuses that are answers, not errors, pass through untouched: ``stuck`` and
``audit --fail-on-check`` exit 3. An interrupt (Ctrl-C) exits 130.

The boundary is ``EffectsGroup.main``: click runs every command inside it, so a new command is
covered without doing anything. It imports no Kafka client: a Kafka exception is recognised only
if ``confluent_kafka`` was imported by the command that raised it.
"""

from __future__ import annotations

import math
import os
import sqlite3
import stat
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from effect_ledger._extras import explain
from effect_ledger.core.timeparse import TimeSpecError
from effect_ledger.errors import LedgerError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
MAX_MESSAGE = 1000  # characters of the one line; a longer message is cut (with an ellipsis)

# Failures of the operator tools, by (module, class): looked up only when that module was imported.
_EXPECTED_ELSEWHERE = (
    ("effect_ledger.ops.sources", "SourceError"),
    ("effect_ledger.streams.admin", "BrokerUnavailable"),
)


@dataclass
class _Settings:
    """What the group's own options set for the command that runs (one command per process;
    reset on every invocation)."""

    verbose: bool = False
    broker_timeout: float | None = None
    ledger: str | None = None  # the --db file of the command, named by a database error


settings = _Settings()


def configure(verbose: bool, broker_timeout: float | None) -> None:
    settings.verbose = verbose
    settings.broker_timeout = broker_timeout
    settings.ledger = None


def broker_wait(default: float) -> float:
    """How long a command waits for a Kafka broker: ``--broker-timeout`` when given, else the
    command's own default."""
    return settings.broker_timeout if settings.broker_timeout is not None else default


def kafka_log_level() -> int:
    """librdkafka's log level for the command's Kafka clients: silent (0) unless ``-v``. A broker
    that is down is reported once, by the command, not line by line by librdkafka."""
    return 6 if settings.verbose else 0  # 6: librdkafka's default


def fail(message: str) -> NoReturn:
    """One line on stderr and exit 1."""
    click.echo(f"effects: {_one_line(message)}", err=True)
    sys.exit(EXIT_ERROR)


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…"


def _kafka_message(e: BaseException) -> str | None:
    ck = sys.modules.get("confluent_kafka")
    if ck is None or not isinstance(e, ck.KafkaException):
        return None
    err: Any = e.args[0] if e.args else None
    return f"Kafka: {err.str() if err is not None and hasattr(err, 'str') else e}"


def _expected_elsewhere(e: BaseException) -> bool:
    for module, name in _EXPECTED_ELSEWHERE:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(e, cls):
            return True
    return False


def message_of(e: BaseException) -> str | None:
    """The one line for an expected failure, or None for an unexpected one."""
    if isinstance(e, click.ClickException):
        msg = e.format_message()
        ctx = getattr(e, "ctx", None)
        if isinstance(e, click.UsageError) and ctx is not None:
            return f"{msg} (see '{ctx.command_path} --help')"
        return msg
    if isinstance(e, LedgerError | TimeSpecError) or _expected_elsewhere(e):
        return str(e)
    kafka = _kafka_message(e)
    if kafka is not None:
        return kafka
    if isinstance(e, sqlite3.Error):  # a ledger file that is not one, or is damaged
        return f"{settings.ledger or 'SQLite'}: {e}"
    if isinstance(e, OSError):
        return str(e) if e.filename is not None or e.strerror is None else e.strerror
    if isinstance(e, ValueError):
        return str(e)
    return None


class EffectsGroup(click.Group):
    """The top-level group: runs the command inside the error boundary (see the module docstring).
    The Kafka commands import their optional dependencies (the ``[kafka]`` / ``[processor]``
    extras) when they run; a missing one becomes ``MissingExtra``, naming the extra to install."""

    group_class = type  # subgroups (``effects topics``) are EffectsGroups too

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ImportError as e:
            # "reconcile", "topics create": the boundary's "effects: " names the program already
            command = " ".join([*ctx.command_path.split()[1:], *filter(None, [ctx.invoked_subcommand])])
            why = explain(e, command)
            if why is None:
                raise
            raise why from e

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:  # a caller that handles errors itself
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # `effects` alone: the help, not an error
            click.echo(e.format_message())
            sys.exit(0)
        except click.Abort:
            click.echo("effects: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:  # noqa: BLE001 - this is the boundary: nothing gets past it as a traceback
            line = message_of(e)
            if line is None:
                if settings.verbose:
                    traceback.print_exc()
                line = f"unexpected error: {type(e).__name__}: {e} (run with -v for the traceback)"
            fail(line)
        sys.exit(rv if isinstance(rv, int) else 0)


# -- validated option types: a bad value is a usage error, caught before anything is opened -----------


class LedgerPath(click.Path):
    """``--db FILE``: a path, remembered so that a database error can name the file. A file that is
    there must be a regular file: a FIFO or a device would be waited on (or read for ever) by
    whatever opens it. A missing file passes unless ``exists`` (a command that creates it)."""

    def __init__(self, exists: bool = False) -> None:
        super().__init__(exists=exists, dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        try:
            st = os.stat(path)
        except OSError:
            st = None  # missing (or unreadable): the command says so, or creates it
        if st is not None and not stat.S_ISREG(st.st_mode):
            self.fail(f"{click.format_filename(path)!r} is not a regular file (a ledger is one).", param, ctx)
        settings.ledger = str(path)
        return path


class Seconds(click.FloatRange):
    """A number of seconds in a range; never ``nan`` or ``inf`` (``1e309`` is ``inf``): a wait
    that is not finite would never end, and ``nan`` passes every comparison of a range."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return rv


#: The longest wait an option takes: a week, the SDK's longest call deadline
#: (``effect_ledger.sdk.ledger.MAX_TIMEOUT_S``; ``demo --timeout`` is one). Past it a value is
#: a mistake, refused here rather than by whatever meets it later (a child's traceback, a hang).
MAX_SECONDS = 7 * 24 * 3600

PORT = click.IntRange(1, 65535)
POSITIVE_SECONDS = Seconds(min=0, min_open=True, max=MAX_SECONDS)
STORE_URL = click.Choice(["rocksdb://", "memory://"])
