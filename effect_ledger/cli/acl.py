"""``effects acl``: the Kafka ACLs each role of effect-ledger needs, printed or applied
(``effect_ledger.streams.acl`` has the table; ``effects topics check --role`` compares a cluster's
ACLs with it)."""

from __future__ import annotations

from typing import Any

import click

from effect_ledger.cli._shared import kafka_config, kafka_options, ready
from effect_ledger.streams.acl import RECONCILER_GROUP, WORKER_APP_ID

ROLE_HELP = "ROLE=PRINCIPAL (repeat): agent, worker, reconciler, sink, operator, subscriber, auditor, admin"


def role_option(required: bool) -> Any:
    return click.option("--role", "roles", multiple=True, required=required, metavar="ROLE=PRINCIPAL", help=ROLE_HELP)


def names_options(fn: Any) -> Any:
    """``--app-id`` and ``--reconciler-group``: the group names the worker and the reconcilers run
    with (their own options), which the worker's and the reconciler's rights name."""
    fn = click.option(
        "--reconciler-group", default=RECONCILER_GROUP, show_default=True,
        help="`effects reconcile --group` (after the prefix)",
    )(fn)  # fmt: skip
    return click.option(
        "--app-id", default=WORKER_APP_ID, show_default=True, help="`effects worker --app-id` (after the prefix)"
    )(fn)


@click.command("acl")
@kafka_options
@role_option(required=True)
@names_options
@click.option(
    "--format", "fmt", type=click.Choice(["kafka-acls", "json"]), default="kafka-acls", show_default=True,
    help="kafka-acls.sh lines, or JSON",
)  # fmt: skip
@click.option(
    "--command-config", default="admin.properties", show_default=True, help="named in the kafka-acls.sh lines"
)
@click.option(
    "--apply", "apply_", is_flag=True, help="create the bindings with the admin client (needs Alter on the cluster)"
)
def acl_command(
    bootstrap: str | None,
    prefix: str | None,
    roles: tuple[str, ...],
    app_id: str,
    reconciler_group: str,
    fmt: str,
    command_config: str,
    apply_: bool,
) -> None:
    """The least Kafka rights of each role, for the topics under --prefix: print them as
    kafka-acls.sh lines (default) or JSON, or create them (--apply, as an administrator). A
    bare principal NAME means User:NAME. Nothing else is ever allowed: a part that lacks one of
    these rights says which one when it starts (NotAuthorized)."""
    from effect_ledger.streams.acl import as_json, grants, kafka_acls_lines, parse_roles

    cfg = kafka_config(bootstrap, prefix)
    given = grants(parse_roles(roles), cfg.topics, app_id=app_id, reconciler_group=reconciler_group)
    if apply_:
        from effect_ledger.streams import rights

        n = rights.apply(ready(cfg, 10), given)
        click.echo(f"{n} ACL bindings for {len(given)} principals in place on {cfg.bootstrap}")
        return
    click.echo(as_json(given) if fmt == "json" else "\n".join(kafka_acls_lines(given, cfg.bootstrap, command_config)))
