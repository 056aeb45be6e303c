"""``effects console``: serve the web console over an embedded ledger file (``--db``) or the Kafka
topics. Resolves its options and runs ``effect_ledger.console.app``."""

from __future__ import annotations

import click

from effect_ledger.cli._boundary import PORT, broker_wait
from effect_ledger.cli._shared import fail, source_options
from effect_ledger.cli.ops import kafka_of
from effect_ledger.errors import ConfigError

TOKEN_ENV = "EFFECTS_CONSOLE_TOKEN"


@click.command("console")
@source_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="address to listen on; beyond loopback it "
    "needs --token or --basic-auth-file, and every page then asks for them",
)
@click.option("--port", type=PORT, default=8080, show_default=True)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    show_envvar=True,
    default=None,
    help="decisions need this token (prefer the environment variable: argv is visible)",
)
@click.option(
    "--basic-auth-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="user:password lines; decisions need one of them, recorded as the operator",
)
@click.option(
    "--targets",
    "targets_spec",
    metavar="FILE",
    envvar="EFFECTS_TARGETS",
    default=None,
    help="the targets declaration: its searchable fields can be searched, its lands_within bounds "
    "ABSENT decisions [env EFFECTS_TARGETS]",
)
def console_command(
    db: str | None,
    bootstrap: str | None,
    prefix: str | None,
    host: str,
    port: int,
    token: str | None,
    basic_auth_file: str | None,
    targets_spec: str | None,
) -> None:
    """A web console: the effects of a window with counts and search, each effect's page (its
    request, receipt, attempts, reconciler answers, run) with decisions behind a confirmation (with
    credentials; read-only without), the stuck list and the escalation queue, the audit with a
    chart. A JSON API behind every page under /api/."""
    from aiohttp import web

    from effect_ledger.console.app import make_app
    from effect_ledger.console.auth import Credentials, load_users
    from effect_ledger.console.source import Source
    from effect_ledger.streams.config import is_loopback

    creds = Credentials(token or None, load_users(basic_auth_file) if basic_auth_file else {})
    beyond = not is_loopback(host)
    if beyond and not creds.configured:
        raise ConfigError(
            f"the console would listen on {host}, beyond loopback, without credentials: set --token or "
            f"{TOKEN_ENV}, or --basic-auth-file, or listen on 127.0.0.1"
        )
    from effect_ledger.targets.load import load_targets

    targets = load_targets(targets_spec) if targets_spec else ()
    if db is not None:
        source = Source(db=db, targets=targets)
    else:
        source = Source(cfg=kafka_of(bootstrap, prefix), targets=targets)
    source.check(broker_wait(10))  # a bad file or a dead broker is one line now, not a page later
    app = make_app(source, creds, guard_reads=beyond)
    line = (
        f"effects console on http://{host}:{port}/ ({source.name}; "
        f"{'decisions need credentials' if creds.configured else 'read-only'})"
    )
    try:
        # run_app calls ``print`` once the socket is bound: the address is shown only when it serves
        web.run_app(app, host=host, port=port, print=lambda _: click.echo(line))
    except OSError as e:  # the port taken, an address not of this host: one line, exit 1
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
