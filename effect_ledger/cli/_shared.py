"""What every ``effects`` command shares: its options, its Kafka settings and broker wait, its
consoles and its tables. Declared once here; errors end in ``cli_boundary`` (one line, exit 1).

Tables print effect ids whole: an id is what an operator copies into ``effects resolve`` or
``effects trace``, so an id column folds onto a second line rather than being cut with an ellipsis,
and ``--wide`` (or output to a file or a pipe) prints every row on one line whatever its width.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from effect_ledger.cli._boundary import LedgerPath, broker_wait, fail, kafka_log_level
from effect_ledger.streams.config import KafkaConfig

__all__ = [
    "bootstrap_option",
    "err",
    "fail",
    "json_lines_option",
    "json_option",
    "kafka_config",
    "kafka_options",
    "min_isr_option",
    "out",
    "print_table",
    "ready",
    "service_log_options",
    "start_logging",
    "source_options",
    "table",
    "topic_options",
    "wide_option",
]

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

Decorator = Callable[[Any], Any]


def _apply(fn: Any, options: list[Decorator]) -> Any:
    for opt in reversed(options):
        fn = opt(fn)
    return fn


_bootstrap = click.option(
    "--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, help="Kafka bootstrap servers [127.0.0.1:9092]"
)
_prefix = click.option("--prefix", envvar="EFFECTS_TOPIC_PREFIX", default=None, help="topic name prefix")
_partitions = click.option(
    "--partitions",
    envvar="EFFECTS_PARTITIONS",
    type=click.IntRange(min=1),
    default=None,
    help="partitions per topic [6]",
)
_min_isr = click.option(
    "--min-insync-replicas",
    "min_isr",
    envvar="EFFECTS_MIN_INSYNC_REPLICAS",
    type=click.IntRange(min=1),
    default=None,
    help="min.insync.replicas of every topic [min(2, EFFECTS_REPLICATION)]",
)


def bootstrap_option(fn: Any) -> Any:
    """``--bootstrap`` alone (``effects demo --kafka``)."""
    return _bootstrap(fn)


def kafka_options(fn: Any) -> Any:
    """``--bootstrap`` and ``--prefix``: where the topics are (every Kafka command)."""
    return _apply(fn, [_bootstrap, _prefix])


def topic_options(fn: Any) -> Any:
    """``--bootstrap --prefix --partitions``: the commands that create or serve the topics."""
    return _apply(fn, [_bootstrap, _prefix, _partitions])


def min_isr_option(fn: Any) -> Any:
    """``--min-insync-replicas``: the commands that create or check the topics."""
    return _min_isr(fn)


def source_options(fn: Any) -> Any:
    """``--db FILE`` (an embedded ledger) or ``--bootstrap``/``--prefix`` (the Kafka topics)."""
    db = click.option("--db", type=LedgerPath(), default=None, help="an embedded ledger file instead of Kafka")
    return _apply(fn, [db, _bootstrap, _prefix])


def json_option(fn: Any, help: str = "JSON output") -> Any:
    return click.option("--json", "as_json", is_flag=True, help=help)(fn)


def json_lines_option(fn: Any) -> Any:
    return json_option(fn, help="JSON lines output")


_log_format = click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="EFFECTS_LOG_FORMAT",
    default="text",
    show_default=True,
    help="the service's log lines on stderr: text for people, json for a log collector (one object a line) "
    "[env EFFECTS_LOG_FORMAT]",
)
_log_summary = click.option(
    "--log-summary",
    type=click.FloatRange(0, 86_400),
    envvar="EFFECTS_LOG_SUMMARY",
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="seconds between summary lines (what the service counted since the last one); 0: none "
    "[env EFFECTS_LOG_SUMMARY]",
)


def service_log_options(fn: Any) -> Any:
    """``--log-format`` and ``--log-summary``: the services' shared logging options
    (``effect_ledger.metrics.logs``; docs/guides/observability.md)."""
    return _apply(fn, [_log_format, _log_summary])


def start_logging(service: str, log_format: str) -> None:
    """Set up this process's log lines for the service ``service`` (before it says anything)."""
    from effect_ledger.cli._boundary import settings
    from effect_ledger.metrics import logs

    logs.setup(log_format, verbose=settings.verbose)
    logs.service(service)


def wide_option(fn: Any) -> Any:
    return click.option(
        "--wide", is_flag=True, help="one line per row, however wide (effect ids are never cut either way)"
    )(fn)


def kafka_config(
    bootstrap: str | None, prefix: str | None, partitions: int | None = None, min_isr: int | None = None
) -> KafkaConfig:
    """The command's Kafka settings (options over the environment); librdkafka's own logging is
    quiet unless ``-v``: a broker that is down is the command's one line, not a log flood."""
    return KafkaConfig.from_env(
        bootstrap=bootstrap,
        prefix=prefix,
        partitions=partitions,
        min_insync_replicas=min_isr,
        log_level=kafka_log_level(),
    )


def ready(cfg: KafkaConfig, default_wait: float) -> KafkaConfig:
    """``cfg`` once a broker answers; ``BrokerUnavailable`` (one line, exit 1 at the boundary) after
    ``--broker-timeout``, or the command's ``default_wait`` seconds."""
    from effect_ledger.streams.admin import wait_ready

    wait_ready(cfg, timeout=broker_wait(default_wait))
    return cfg


def table(title: str | None, *columns: str, right: tuple[str, ...] = ()) -> Table:
    """A table whose cells are never cut: on a narrow terminal they fold onto more lines (an id
    folded is still the whole id; ``--wide`` prints it on one). ``right``: number columns."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold", justify="right" if c in right else "left")
    return t


def print_table(t: Table, wide: bool = False) -> None:
    """Print ``t``: one line per row with ``wide``, and to a file or a pipe (no terminal width to
    respect there, and a script reads rows, not folded lines)."""
    if wide or not out.is_terminal:
        need = Measurement.get(out, out.options.update_width(1 << 16), t).maximum
        Console(
            file=out.file, width=max(out.width, need), color_system=out.color_system,  # type: ignore[arg-type]
            force_terminal=out.is_terminal,
            highlight=False,
        ).print(t)  # fmt: skip
    else:
        out.print(t)
