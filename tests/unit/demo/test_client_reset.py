"""The demo's gateway client resets the connection of a call the ledger cut off at its deadline.

With an orderly close (FIN), the kernel keeps retransmitting request bytes a network partition held
back and delivers them when it heals: the chaos run found two refunds made that way after a
reconciler had found their keys absent (its deadline plus the target's ``lands_within`` were long
past). A reset drops them. Here a server reads the request and never answers; the call is cut off
by a timeout, as ``execute`` cuts a call at the intent's deadline: the server's next read meets a
reset, not an end of stream."""

from __future__ import annotations

import asyncio

import pytest

from effect_ledger.demo.client import GatewayClient


def test_a_call_cut_off_resets_its_connection() -> None:
    async def go() -> BaseException | bytes:
        seen: asyncio.Future[BaseException | bytes] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")  # the request arrived; no answer is given
            try:
                seen.set_result(await asyncio.wait_for(reader.read(), 5))
            except (ConnectionResetError, TimeoutError) as e:
                seen.set_result(e)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, GatewayClient(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await client.refund("o-1", 100, idempotency_key="k-1")
            return await asyncio.wait_for(seen, 10)

    outcome = asyncio.run(go())
    assert isinstance(outcome, ConnectionResetError), f"the server saw {outcome!r}, not a reset"
