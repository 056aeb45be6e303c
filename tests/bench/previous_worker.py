"""The processor as it was before batching (processors/processor.py at ``PREVIOUS_REV``), run as a
worker for the same-run comparison in ``processor_throughput``:

    python -m tests.bench.previous_worker --module-dir DIR worker --bootstrap B --prefix P ...

``DIR`` holds ``previous_processor.py`` (``git show PREVIOUS_REV:processors/processor.py``). Takes the
arguments of ``effects worker`` that ``effect_ledger.processors.supervise.Processor`` passes."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import faust

#: The last commit of processors/processor.py before the batched processor (one event at a time,
#: every event of a key concatenated in the table value).
PREVIOUS_REV = "4432fc9"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--module-dir", required=True)
    p.add_argument("command")
    for flag in ("--bootstrap", "--prefix", "--data-dir", "--web-host", "--store", "--loglevel"):
        p.add_argument(flag, required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--web-port", type=int, required=True)
    args = p.parse_args()
    sys.path.insert(0, args.module_dir)
    mod = importlib.import_module("previous_processor")
    from effect_ledger.streams.config import KafkaConfig

    cfg = KafkaConfig.from_env(bootstrap=args.bootstrap, prefix=args.prefix, partitions=args.partitions)
    settings = mod.ProcessorSettings(kafka=cfg, data_dir=Path(args.data_dir), store=args.store,
                                     web_host=args.web_host, web_port=args.web_port)  # fmt: skip
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    processor = mod.LedgerProcessor(settings)
    worker = faust.Worker(processor.app, loglevel=args.loglevel, quiet=True, redirect_stdouts=False)
    worker.spinner = None
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
