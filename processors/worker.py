"""Running the ledger processor as a faust worker process."""

from __future__ import annotations

import logging
from typing import Any

import faust

from effect_ledger.errors import NotAuthorized
from effect_ledger.metrics import logs
from effect_ledger.processors import _faust_internals as faust_internals
from effect_ledger.processors.processor import LedgerProcessor, ProcessorSettings
from effect_ledger.streams.config import operator_identity

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
    try:
        worker.execute_from_commandline()  # exits (SystemExit) however it ends; a crash's cause is kept
    except SystemExit:
        # A right the ACLs took away while it ran, refused by Kafka before the rights check said so
        # (an offset commit or a fetch): the worker has stopped, nothing past its last commit is
        # acknowledged, and the operator reads which right in one line, not a client's traceback.
        crash = worker.crash_reason
        lost = lost_rights(crash, settings) if crash is not None else []
        if not lost:
            raise
        log.error("Kafka no longer gives this worker: %s; stopped", "; ".join(lost))
        raise NotAuthorized("effects worker", operator_identity(k), lost) from crash


def lost_rights(error: BaseException, settings: ProcessorSettings) -> list[str]:
    """The rights an authorization error somewhere in ``error``'s chain says the worker lacks
    (``Read on topic NAME`` lines); empty when the chain holds none."""
    refused = faust_internals.refused_authorization(error)
    if refused is None:
        return []
    kind, names = refused
    if kind == "group":
        return [f"Read on group {settings.full_app_id}"]
    topics = settings.kafka.topics
    consumed = {topics.events, topics.decisions}
    return [f"{'Read' if t in consumed else 'Write'} on topic {t}" for t in names] or [
        "a right on one of its topics (the broker did not say which)"
    ]
