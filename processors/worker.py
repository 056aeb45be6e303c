"""Running the ledger processor as a faust worker process."""

from __future__ import annotations

from typing import Any

import faust

from effect_ledger.processors.processor import LedgerProcessor, ProcessorSettings


def run_worker(settings: ProcessorSettings, loglevel: str = "warning", metrics: Any = None) -> None:
    """Run until SIGTERM/SIGINT (faust installs the handlers and stops cleanly). ``metrics``: a
    ``LedgerMetrics`` the fold and the timer update (served by the caller)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    processor = LedgerProcessor(settings, metrics=metrics)
    worker = faust.Worker(processor.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # faust's start-up spinner sets the root logger to DEBUG whatever the level: every aiokafka
    # debug call would then build a log record (about a tenth of the worker's CPU).
    worker.spinner = None
    worker.execute_from_commandline()
