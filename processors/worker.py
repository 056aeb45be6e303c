"""Running the ledger processor as a faust worker process."""

from __future__ import annotations

import logging
from typing import Any

import faust

from effect_ledger.metrics import logs
from effect_ledger.processors.processor import LedgerProcessor, ProcessorSettings

log = logging.getLogger("effect_ledger.processor")


def run_worker(settings: ProcessorSettings, loglevel: str = "warning", metrics: Any = None) -> None:
    """Run until SIGTERM/SIGINT (faust installs the handlers and stops cleanly). ``metrics``: a
    ``LedgerMetrics`` the fold and the timer update (served by the caller)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # The command's one logging setup (effect_ledger.metrics.logs), made again here for the spawned
    # workers of --processes; faust's own (colorlog, its format) is not installed over it.
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    logs.setup(settings.log_format, verbose=verbose)
    logs.service("worker")
    level = logging.getLevelName(loglevel.upper())
    if isinstance(level, int) and level < logging.getLogger().level:
        logging.getLogger().setLevel(level)  # --loglevel: faust's and the Kafka client's lines too
    processor = LedgerProcessor(settings, metrics=metrics)
    k = settings.kafka
    logs.started(
        log,
        f"ledger processor folding {k.topics.events} and {k.topics.decisions} from {k.bootstrap} "
        f"(group {settings.full_app_id}), table in {settings.data_dir}, lookups on "
        f"http://{settings.web_host}:{settings.web_port}",
        bootstrap=k.bootstrap,
        topics=[k.topics.events, k.topics.decisions, k.topics.state, k.topics.uncertain, k.topics.dlq],
        group=settings.full_app_id,
        data_dir=str(settings.data_dir),
        store=settings.store,
        web=f"{settings.web_host}:{settings.web_port}",
        partitions=k.partitions,
        targets=sorted(settings.targets),
    )
    worker = faust.Worker(processor.app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    # faust's start-up spinner sets the root logger to DEBUG whatever the level: every aiokafka
    # debug call would then build a log record (about a tenth of the worker's CPU).
    worker.spinner = None
    worker.execute_from_commandline()
