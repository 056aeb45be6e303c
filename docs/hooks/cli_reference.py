"""MkDocs hook: the pages generated from the code when the site is built, so that they can never
disagree with it: the command-line reference (``reference/cli.md``) from the click commands (what
``effects --help`` says), and the table of metrics in ``reference/metrics.md`` from
``effect_ledger.metrics.names.METRICS`` (at the marker ``METRICS_MARKER``).

mkdocs.yml names this file under ``hooks:``; ``python docs/hooks/cli_reference.py`` prints the page."""

from __future__ import annotations

import inspect
from typing import Any

import click

PAGE = "reference/cli.md"
METRICS_PAGE = "reference/metrics.md"
METRICS_MARKER = "<!-- the table of metrics: generated from effect_ledger/metrics/names.py when the site is built -->"


def _option_row(p: click.Parameter, ctx: click.Context) -> str:
    assert isinstance(p, click.Option)
    names = ", ".join(f"`{n}`" for n in [*p.opts, *p.secondary_opts])
    if p.is_flag:
        kind = "flag"
    else:
        kind = p.type.name.lower() if p.type is not None else "text"
        if isinstance(p.type, click.Choice):
            kind = " \\| ".join(f"`{c}`" for c in p.type.choices)
    if p.multiple:
        kind += ", repeatable"
    default = ""
    if p.show_default and not p.is_flag and p.default is not None and not callable(p.default):
        default = f"`{p.default}`"
    env = f"`{p.envvar}`" if isinstance(p.envvar, str) else ""
    text = (p.help or "").replace("|", "\\|").replace("\n", " ")
    if p.required:
        text = "**required.** " + text
    return f"| {names} | {kind} | {default} | {env} | {text} |"


def _command(cmd: click.Command, path: list[str], out: list[str], envvars: dict[str, str]) -> None:
    name = " ".join(path)
    ctx = click.Context(cmd, info_name=name)
    out.append(f"{'#' * min(len(path) + 1, 4)} `{name}`\n")
    if cmd.help:
        # click keeps the docstring's indentation; Markdown would read it as a code block.
        out.append(inspect.cleandoc(cmd.help).replace("\b\n", "") + "\n")
    pieces = cmd.collect_usage_pieces(ctx)
    out.append(f"```\n{name} {' '.join(pieces)}\n```\n")
    args = [p for p in cmd.params if isinstance(p, click.Argument)]
    if args:
        out.append("Arguments: " + ", ".join(f"`{a.human_readable_name}`" for a in args) + ".\n")
    opts = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
    if opts:
        out.append("| option | takes | default | environment | what it does |")
        out.append("|---|---|---|---|---|")
        for p in opts:
            out.append(_option_row(p, ctx))
            if isinstance(p.envvar, str):
                envvars.setdefault(p.envvar, name)
        out.append("")
    if isinstance(cmd, click.Group):
        for sub in sorted(cmd.list_commands(ctx)):
            child = cmd.get_command(ctx, sub)
            if child is not None and not child.hidden:
                _command(child, [*path, sub], out, envvars)


def cli_markdown() -> str:
    from effect_ledger.cli.main import main

    out = [
        "# Command line: `effects`\n",
        "Generated from the commands themselves when the site is built (`docs/hooks/cli_reference.py`): "
        "what `effects COMMAND --help` says, on one page. Every error is one line on stderr and exit "
        "status 1; `effects -v COMMAND` adds an unexpected error's traceback.\n",
    ]
    envvars: dict[str, str] = {}
    body: list[str] = []
    _command(main, ["effects"], body, envvars)
    out += body
    out.append("## Environment variables read by options\n")
    out.append("| variable | first used by |")
    out.append("|---|---|")
    for var, by in sorted(envvars.items()):
        out.append(f"| `{var}` | `{by}` |")
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=cli_markdown()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != METRICS_PAGE:
        return markdown
    from effect_ledger.metrics.names import markdown_table

    if METRICS_MARKER not in markdown:
        raise ValueError(f"{METRICS_PAGE} lost its marker for the table of metrics")
    return markdown.replace(METRICS_MARKER, markdown_table())


if __name__ == "__main__":
    print(cli_markdown())
