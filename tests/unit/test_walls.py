"""The walls between the rooms are checked, not hoped for: ``scripts/lint-imports.sh`` (run by
``make lint``) keeps every import-linter contract on this tree, and fails when a wall is broken on
purpose in a copy of it: the pure core importing the SDK, the streams room importing faust, the
store importing the SDK above it, an app importing another app."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "lint-imports.sh"
LINTER = Path(sys.executable).parent / "lint-imports"


def walls(root: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LINT_IMPORTS": str(LINTER)}
    return subprocess.run(["bash", str(SCRIPT), str(root)], capture_output=True, text=True, env=env, timeout=120)


def copy_of_tree(tmp_path: Path) -> Path:
    for name in ("effect_ledger", "schemas", "streams", "processors"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_this_tree_keeps_every_wall() -> None:
    out = walls(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("effect_ledger/core/effect.py", "import effect_ledger.sdk.ledger", "Rooms are layered"),
        ("effect_ledger/core/plan.py", "import sqlite3", "The core is pure"),
        ("streams/codec.py", "import faust", "The streams room is the topics"),
        ("effect_ledger/sdk/store/tables.py", "import effect_ledger.sdk.erasure", "The ledger file's store"),
        ("effect_ledger/mcp/wire.py", "import effect_ledger.console.app", "Rooms are layered"),
        ("processors/processor.py", "import aiokafka", "aiokafka, under faust"),
    ],
    ids=[
        "core-imports-sdk",
        "core-does-io",
        "streams-imports-faust",
        "store-imports-sdk",
        "app-imports-app",
        "aiokafka",
    ],
)
def test_a_wall_broken_on_purpose_fails(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = copy_of_tree(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{line}  # a wall broken on purpose\n")
    out = walls(root)
    assert out.returncode != 0
    assert f"{contract}" in out.stdout and "BROKEN" in out.stdout, out.stdout


def test_every_room_says_what_it_holds_and_the_layout_lists_it() -> None:
    """Each package folder's ``__init__`` docstring says what lives there and what it may import, and
    the layout page of the docs (docs/reference/layout.md) and the README's short map name the folder."""
    import ast

    layout = (ROOT / "docs/reference/layout.md").read_text()
    block = layout.split("# Layout", 1)[1].split("```", 2)[1]
    readme = (ROOT / "README.md").read_text()
    short = readme.split("## Layout", 1)[1].split("```", 2)[1]
    rooms = sorted(
        p.parent
        for top in ("effect_ledger", "streams", "processors")
        for p in (ROOT / top).rglob("__init__.py")
        if p.parent != ROOT / "effect_ledger"
    )
    assert len(rooms) >= 14
    for room in rooms:
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
        assert "import" in doc.lower(), f"{room.relative_to(ROOT)}/__init__.py does not say what it may import"
        assert f"{room.name}/" in block, f"docs/reference/layout.md does not list {room.relative_to(ROOT)}/"
        assert f"{room.name}/" in short, f"README's layout does not list {room.relative_to(ROOT)}/"
