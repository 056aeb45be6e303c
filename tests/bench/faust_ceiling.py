"""How fast faust-streaming itself delivers records to an agent that does nothing with them: the
ceiling of any faust processor on this machine, next to the ledger processor's figure.

    python -m tests.bench.faust_ceiling --bootstrap B --topic T --count N

Prints one line: ``<events/s>``. Runs as a child process (faust owns its event loop and exits by
signal).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
import uuid

import faust


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, required=True)
    args = p.parse_args()
    app = faust.App(
        f"faust-ceiling-{uuid.uuid4().hex[:8]}", broker=f"kafka://{args.bootstrap}", datadir=tempfile.mkdtemp(),
        web_enabled=False, consumer_auto_offset_reset="earliest",
    )  # fmt: skip
    topic = app.topic(args.topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    seen = {"n": 0, "t0": 0.0}

    @app.agent(topic)
    async def count(stream):  # type: ignore[no-untyped-def]
        async for _event in stream.events():
            if seen["n"] == 0:
                seen["t0"] = time.monotonic()
            seen["n"] += 1
            if seen["n"] >= args.count:
                rate = (seen["n"] - 1) / (time.monotonic() - seen["t0"])
                with open(os.environ["FAUST_CEILING_OUT"], "w") as f:
                    f.write(f"{rate:.1f}\n")
                os.kill(os.getpid(), signal.SIGTERM)

    worker = faust.Worker(app, loglevel="error", quiet=True)
    worker.spinner = None
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
