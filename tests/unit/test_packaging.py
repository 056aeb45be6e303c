"""What gets installed: every package folder and schema file is declared in pyproject.toml (so the
wheel has them: ``test_wheel.py`` builds it and looks), and the base install, the embedded SDK and
the operator CLI, never imports the optional Kafka modules: here in the dev venv, cheaply, with
those modules made unimportable as they are in the base install."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.packaging import (
    KAFKA_MODULES,
    PROBE,
    ROOT,
    check_embedded,
    check_missing_kafka_extra,
    missing_extra_line,
    package_folders,
    source_files,
)


@pytest.fixture(scope="module")
def setuptools_config() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]  # type: ignore[no-any-return]


def test_every_package_folder_is_listed(setuptools_config: dict[str, Any]) -> None:
    folders = package_folders()
    assert {"effect_ledger.ops", "effect_ledger.demo"} <= set(folders)  # not vacuous
    assert sorted(setuptools_config["packages"]) == sorted(folders)
    # Each listed package maps (package-dir) to the folder it really is in.
    mapping = setuptools_config["package-dir"]
    for package, folder in folders.items():
        base = max((k for k in mapping if package == k or package.startswith(k + ".")), key=len)
        rest = package.removeprefix(base).lstrip(".")
        assert ROOT / mapping[base] / Path(*rest.split(".") if rest else ()) == folder, package


def test_every_schema_is_package_data(setuptools_config: dict[str, Any]) -> None:
    schemas = source_files(".avsc")
    assert len(schemas) >= 9
    data = setuptools_config["package-data"]
    folders = package_folders()
    for path in schemas:
        # The package the file belongs to is its nearest package folder (the file's own, for data).
        package = max((p for p, f in folders.items() if f in path.parents), key=len)
        # setuptools globs each pattern in the package's folder ("*.avsc" does not reach a subfolder).
        covered = {hit for pattern in data.get(package, []) for hit in folders[package].glob(pattern)}
        assert path in covered, f"{path.relative_to(ROOT)} is not in {package}'s package-data"
    assert "py.typed" in data["effect_ledger"] and (ROOT / "effect_ledger/py.typed").exists()


def probe(*args: str) -> dict[str, Any]:
    """Run ``embedded_probe.py`` in a child process of the dev venv (``-c``, as a user's script)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.read_text(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_embedded_sdk_and_cli_import_no_kafka_module() -> None:
    """Importing the public API, executing through Ledger and SyncLedger and running the embedded
    commands load nothing from faust, aiokafka, confluent_kafka or rocksdict (all installed here)."""
    report = probe()
    check_embedded(report)
    assert report["file"] == str(ROOT / "effect_ledger/__init__.py")


def test_kafka_mode_without_the_extra_is_a_typed_error() -> None:
    """With the Kafka modules unimportable (the base install), the embedded SDK still works and
    ``Ledger.open(kafka=...)`` raises ``MissingExtra`` naming the extra, before creating the file."""
    report = probe("block")
    check_embedded(report)
    check_missing_kafka_extra(report)


# Every command that needs an extra, and which: run without it, each says so in one line.
KAFKA_COMMANDS = {
    "worker": ("worker",),
    "demo --kafka": ("demo", "--kafka"),
    "reconcile": ("reconcile", "--targets", "targets.example.toml"),
    "topics create": ("topics", "create"),
    "topics list": ("topics", "list"),
    "relay": ("relay", "--db", "pyproject.toml"),
    "tail": ("tail",),
    "sink": ("sink", "--to", "sqlite:///unused.db"),
    "audit": ("audit", "--from", "-1h"),
    "trace": ("trace", "some-key"),
    "stuck": ("stuck",),
    "escalations": ("escalations",),
    "resolve": ("resolve", "some-key", "--absent", "--by", "ops", "--reason", "checked"),
}
NEEDS = {"worker": "processor", "demo --kafka": "processor"}  # the rest need [kafka]


BLOCKED_CLI = f"""
import sys
for name in {KAFKA_MODULES!r}:
    sys.modules[name] = None
from effect_ledger.cli.main import main
sys.argv[0] = "effects"
main()
"""


@pytest.mark.parametrize("command", list(KAFKA_COMMANDS))
def test_kafka_command_without_its_extra_says_which_in_one_line(command: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED_CLI, *KAFKA_COMMANDS[command]],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "EFFECTS_TARGETS": ""},
    )
    assert (out.returncode, out.stderr) == (1, missing_extra_line(command, NEEDS.get(command, "kafka")))
    assert out.stdout == ""
