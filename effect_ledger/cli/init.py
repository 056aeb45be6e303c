"""``effects init``: write a starter targets declaration into the current folder (the package's
``effect_ledger/targets/starter.toml``), so that the README's example runs as copied. It never
overwrites a file."""

from __future__ import annotations

import os
from importlib.resources import files

import click

from effect_ledger.errors import TargetsError

STARTER = "starter.toml"


def starter_text() -> str:
    """The starter declaration shipped in the wheel."""
    return files("effect_ledger.targets").joinpath(STARTER).read_text(encoding="utf-8")


@click.command("init")
@click.option(
    "--targets",
    "targets_file",
    type=click.Path(dir_okay=False),
    default="targets.toml",
    show_default=True,
    help="the file to write; an existing file (or anything else at that path) is left as it is",
)
def init_command(targets_file: str) -> None:
    """Write a starter targets declaration: one destination, ``payments``, that nothing can ask yet
    (an uncertain effect goes to a person), and the lines to say how to ask yours."""
    path = targets_file
    text = starter_text().encode()
    try:
        # O_EXCL: the check and the creation are one step, so a file that appears meanwhile is not
        # overwritten either; O_NOFOLLOW: a dangling symlink is not followed to create its target.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise TargetsError(f"{path} already exists: effects init never overwrites a file") from None
    except OSError as e:
        raise TargetsError(f"{path}: cannot create it ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
    except OSError as e:  # a full disk: leave no half-written declaration behind
        os.unlink(path)
        raise TargetsError(f"{path}: cannot write it ({e.strerror})") from None
    click.echo(f'wrote {path}: one destination, payments (lookup = "none"); edit it to declare yours')
