"""``effects mcp-proxy``: record every write an agent makes through an MCP server.

The MCP side needs no SDK (the proxy speaks JSON-RPC on the wire); the ``[mcp]`` extra pins the
``mcp`` package it is tested against, for writing agents and servers.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import click

from effect_ledger.cli._shared import fail


@click.command("mcp-proxy", context_settings={"allow_interspersed_args": False})
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="the ledger file")
@click.option(
    "--targets",
    "targets_spec",
    metavar="FILE",
    envvar="EFFECTS_TARGETS",
    required=True,
    help="the targets file; its [mcp.writes.TOOL] tables declare the write tools [env EFFECTS_TARGETS]",
)
@click.option("--writes", multiple=True, metavar="TOOL,...", help="more write tools (recorded on --target)")
@click.option("--target", default=None, help="the declared target of --writes [the only one declared]")
@click.option("--lookup-tool", "lookups", multiple=True, metavar="TOOL=LOOKUP", help="a write tool's lookup tool")
@click.option("--run-id", envvar="EFFECTS_RUN_ID", default=None, help="the run, when the agent passes none in _meta")
@click.option("--upstream", default=None, metavar="URL", help="a streamable HTTP server instead of a command")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="with --upstream: where to listen; beyond loopback it needs --token",
)
@click.option(
    "--token",
    envvar="EFFECTS_MCP_TOKEN",
    default=None,
    help="with --upstream: every request must carry it in the Effect-Ledger-Token header [env EFFECTS_MCP_TOKEN]",
)
@click.option("--port", type=int, default=8765, show_default=True, help="with --upstream: port (0: any free one)")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def mcp_proxy(
    db: str,
    targets_spec: str,
    writes: tuple[str, ...],
    target: str | None,
    lookups: tuple[str, ...],
    run_id: str | None,
    upstream: str | None,
    host: str,
    token: str | None,
    port: int,
    command: tuple[str, ...],
) -> None:
    """Sit between an agent and an MCP server; record each call of a write tool as an effect.

    stdio: effects mcp-proxy --db effects.db --targets targets.toml -- python server.py

    HTTP: effects mcp-proxy --db effects.db --targets targets.toml --upstream http://127.0.0.1:8000/mcp

    Without a run id (from the agent's _meta or --run-id), a write tool's call that repeats the same
    arguments within the tool's repeat_window (default 24h) is the same effect, also through a
    restarted proxy; a tool declared repeats = "per-session" opts out. The proxy prints, at start,
    which rule each write tool runs under.
    """
    from effect_ledger.errors import LedgerError
    from effect_ledger.mcp.policy import load_policy
    from effect_ledger.sdk.ledger import Ledger
    from effect_ledger.targets.load import load_targets

    if bool(command) == bool(upstream):
        fail("give the server: a command after -- (stdio) or --upstream URL (streamable HTTP), not both")
    from effect_ledger.streams.config import is_loopback

    if upstream and not is_loopback(host) and not token:
        fail(
            f"the proxy would listen on {host}, beyond loopback, without a credential: set --token or "
            "EFFECTS_MCP_TOKEN (clients send it in the Effect-Ledger-Token header), or listen on 127.0.0.1"
        )
    flagged = [t for spec in writes for t in spec.split(",")]
    try:
        declared = load_targets(targets_spec)
        file = targets_spec if targets_spec.endswith(".toml") else None
        policy = load_policy(
            file, [t.name for t in declared], writes=flagged, target=target, lookups=lookups, run_id=run_id
        )
    except LedgerError as e:
        fail(str(e))
    if not policy.writes:
        click.echo("effects mcp-proxy: no write tools declared: every call passes through unrecorded", err=True)
    for write in policy.writes.values():  # said before anything runs: which rule keys each write
        click.echo(f"effects mcp-proxy: {write.describe(policy.run_id)}", err=True)

    async def go() -> int:
        from effect_ledger.mcp.calls import WriteCalls

        ledger = await Ledger.open(db, targets=list(declared))
        try:
            calls = WriteCalls(ledger, policy)
            if command:
                from effect_ledger.mcp.stdio import serve_stdio

                return await serve_stdio(calls, list(command))
            from effect_ledger.mcp.http import serve_http

            assert upstream is not None
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await serve_http(calls, upstream, host, port, stop, token=token or None)
            return 0
        finally:
            await ledger.close()

    try:
        sys.exit(asyncio.run(go()))
    except LedgerError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot start: {e}")
