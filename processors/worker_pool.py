"""``effects worker --processes N``: N ledger processor workers on one machine, one process each
(a worker folds on one core: Python runs one thread at a time). They join one consumer group, so
faust shares the partitions among them and moves them when one stops; each has its own data dir
(``DATA_DIR/worker-I``), lookup port (``PORT + I``) and metrics port (``PORT + I``), and any of them
answers any lookup (it forwards to the owner of the key's partition).

Sizing: one worker per core the processor may use, and at least as many partitions as workers (a
worker without a partition idles); the parent only starts, watches and stops its children."""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import sys
import time
from typing import Any

from effect_ledger.processors.processor import ProcessorSettings


def child_settings(settings: ProcessorSettings, i: int) -> ProcessorSettings:
    """The settings of worker ``i`` of a pool: its own data dir and lookup port."""
    if settings.advertised_url:
        raise ValueError("--advertised-url names one worker: give each worker its own (run them one by one)")
    return dataclasses.replace(settings, data_dir=settings.data_dir / f"worker-{i}", web_port=settings.web_port + i)


def _child(
    settings: ProcessorSettings, loglevel: str, metrics_port: int | None, metrics_host: str, metrics_token: str | None
) -> None:
    from effect_ledger.processors.worker import run_worker

    metrics = None
    if metrics_port is not None:
        from effect_ledger.metrics.names import LedgerMetrics

        metrics = LedgerMetrics(feature="effects worker --metrics-port")
        metrics.serve(metrics_port, metrics_host, metrics_token)
    run_worker(settings, loglevel=loglevel, metrics=metrics)


def run_pool(settings: ProcessorSettings, processes: int, loglevel: str = "warning",
             metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
             metrics_token: str | None = None) -> int:  # fmt: skip
    """Run ``processes`` workers until SIGTERM/SIGINT (passed on to each) or until one exits (the
    others are stopped then). Returns the exit status: 0 after a signal, else the first child's."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each: faust owns its event loop
    children = []
    for i in range(processes):
        port = metrics_port + i if metrics_port is not None else None
        args = (child_settings(settings, i), loglevel, port, metrics_host, metrics_token)
        p = ctx.Process(target=_child, args=args, daemon=False)
        p.start()
        children.append(p)
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for c in children:
            if c.is_alive() and c.pid is not None:
                c.terminate() if signum == signal.SIGTERM else _signal(c.pid, signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    while any(c.is_alive() for c in children):
        for c in children:
            c.join(0.2)
            if not c.is_alive() and not stopping:
                status = c.exitcode or 1
                print(f"effects worker: worker {children.index(c)} exited ({c.exitcode}); stopping the others",
                      file=sys.stderr)  # fmt: skip
                stop(signal.SIGTERM, None)
    deadline = time.monotonic() + 30
    for c in children:
        c.join(max(0.0, deadline - time.monotonic()))
        if c.is_alive():
            c.kill()
    return status


def _signal(pid: int, signum: int) -> None:
    import os

    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
