"""The console's real aiohttp app served on a loopback port from a background thread, for the API
and browser tests: real HTTP, a real ledger file."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from effect_ledger.console.app import make_app
from effect_ledger.console.auth import Credentials
from effect_ledger.console.source import Source


@contextmanager
def serve(db: str | Source, credentials: Credentials, *, guard_reads: bool = False) -> Iterator[str]:
    """Serve the console over ``db`` (a ledger file, or any ``Source``) on 127.0.0.1 (a free port);
    yields its base URL. ``guard_reads``: as when it listens beyond loopback."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, object] = {}

    async def start() -> web.AppRunner:
        runner = web.AppRunner(
            make_app(db if isinstance(db, Source) else Source(db=db), credentials, guard_reads=guard_reads)
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["runner"] = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    if not ready.wait(30):
        raise RuntimeError("the console did not start within 30 s")
    try:
        yield str(box["url"])
    finally:
        runner = box["runner"]
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        t.join(30)
        loop.close()
