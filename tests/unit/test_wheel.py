"""The wheel a user installs: built from this tree, installed (not editable) into a fresh venv in a
temporary folder that also holds a user's own ``schemas.py``, ``streams.py`` and ``processors/``
(each raising on import), and used from there as a user would: ``effects --help``, ``effects demo``,
the whole public API, an embedded ledger. Only the base install: the optional Kafka modules are not
there, and the Kafka commands say which extra to install. Then: does installing it next to DBOS
downgrade anything?

Slow (a venv and pip: about a minute, once per session, through the module-scoped fixtures) and
needs pip to reach PyPI or its cache for the dependencies. Marked ``wheel``: ``-m "not wheel"``
leaves it out of a quick run; ``make test`` and ``make test-unit`` run it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.packaging import (
    PROBE,
    ROOT,
    ROOTS,
    check_embedded,
    check_missing_kafka_extra,
    installed_path,
    missing_extra_line,
    package_folders,
    source_files,
)

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(900)]

DBOS = "dbos==3.4.0"
DECOY = "raise RuntimeError(\"a user's own {name} was imported instead of effect_ledger's\")\n"


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


def _checked(out: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert out.returncode == 0, f"{' '.join(map(str, out.args))[:300]}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps`` of a copy of the tree (building in place would leave build/ and
    *.egg-info in the repository)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ROOTS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = _checked(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(src)]))
    # A data folder missing from pyproject's packages makes setuptools warn on every install.
    assert "is absent from the `packages` configuration" not in out.stdout + out.stderr, out.stderr[-3000:]
    (built,) = (work / "dist").glob("effect_ledger_kafka-*.whl")
    return built


@dataclass
class Venv:
    bin: Path
    project: Path  # the user's folder, with the decoys: the working directory of every command

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        # The decoys come before site-packages for every process, the `effects` script included.
        env["PYTHONPATH"] = str(self.project)
        env["COLUMNS"] = "120"
        env.pop("EFFECTS_TARGETS", None)
        env.pop("KAFKA_BOOTSTRAP", None)
        return env

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=self.project, env=self.env())

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "python"), "-m", "pip", "--disable-pip-version-check", *args, timeout=600)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    """A fresh venv holding the wheel (base install, no extras), and the user's folder with decoys."""
    work = tmp_path_factory.mktemp("user")
    project = work / "project"
    (project / "processors").mkdir(parents=True)
    (project / "schemas.py").write_text(DECOY.format(name="schemas.py"))
    (project / "streams.py").write_text(DECOY.format(name="streams.py"))
    (project / "processors/__init__.py").write_text(DECOY.format(name="processors/"))
    _checked(_run([sys.executable, "-m", "venv", str(work / "venv")]))
    v = Venv(work / "venv/bin", project)
    _checked(v.pip("install", "-q", str(wheel)))
    return v


def test_wheel_holds_every_package_module_and_schema(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = package_folders()
    assert len(packages) >= 6
    # Every file of every package folder: modules, schemas, the console's static files, demo data.
    files = [p for folder in packages.values() for p in folder.iterdir() if p.is_file()]
    assert set(source_files(".py") + source_files(".avsc")) <= set(files)  # not vacuous
    for path in files:
        assert installed_path(path) in names, path
    assert "effect_ledger/py.typed" in names
    # One import root: nothing else at the top of site-packages.
    assert {n.split("/")[0] for n in names} == {"effect_ledger", wheel.name.split("-py3")[0] + ".dist-info"}


def test_wheel_metadata_base_needs_no_kafka_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
    requires = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert sorted(re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in base) == [
        "aiohttp",
        "aiosqlite",
        "click",
        "fastavro",
        "rich",
    ]
    assert all("==" not in r for r in base), base  # ranges: a library pins nothing next to an application
    assert "Provides-Extra: kafka" in text and "Provides-Extra: processor" in text


def test_decoys_are_on_the_path(venv: Venv) -> None:
    # Not vacuous: a bare `import schemas` / `import processors` in that folder gets the user's.
    for name in ("schemas", "streams", "processors"):
        out = venv.run("python", "-c", f"import {name}")
        assert out.returncode == 1 and "a user's own" in out.stderr, (name, out.stderr)


def test_effects_help(venv: Venv) -> None:
    out = _checked(venv.run("effects", "--help"))
    for command in ("demo", "run", "audit", "trace", "stuck", "escalations", "resolve", "worker", "reconcile"):
        assert re.search(rf"^\s+{command}\s", out.stdout, re.M), command
    assert out.stderr == ""


def test_effects_demo_one_refund_at_the_gateway(venv: Venv) -> None:
    out = _checked(venv.run("effects", "demo", timeout=300))
    text = out.stdout
    # The summary table: the naive retry paid twice, the ledger run once.
    assert re.search(r"naive retry\W+2\W+9,600\W", text), text[-3000:]
    assert re.search(r"effect-ledger\W+1\W+4,800\W+PENDING -> UNCERTAIN -> CONFIRMED", text), text[-3000:]
    assert "gateway: 1 refund: re_0001" in text


def test_the_readme_first_effect_runs_on_the_base_install(venv: Venv) -> None:
    """The README's "Your first effect" section (``effects init``, the example, ``effects trace`` and
    ``audit``) as a new user runs it: the built wheel, no extras, the starter targets file from the
    wheel's package data."""
    from tests.unit.test_readme import first_effect_script

    script, _ = first_effect_script()
    out = _checked(venv.run("bash", "-c", script))
    assert out.stdout.count("gateway: refund 4800 for order 1001") == 1, out.stdout[-3000:]
    assert "re_1001 (recorded before: not called again)" in out.stdout
    assert "state: CONFIRMED" in out.stdout
    assert (venv.project / "first-effect/targets.toml").is_file()


def test_public_api_and_embedded_ledger_load_no_kafka_module(venv: Venv) -> None:
    out = _checked(venv.run("python", "-c", PROBE.read_text()))
    report = json.loads(out.stdout)
    # The installed copy, not the repository's folders.
    assert "site-packages" in report["file"] and not report["file"].startswith(str(ROOT)), report["file"]
    check_embedded(report)
    check_missing_kafka_extra(report)  # confluent-kafka is really absent here


@pytest.mark.parametrize(
    ("args", "command", "extra"),
    [
        (("worker",), "worker", "processor"),
        (("topics", "list"), "topics list", "kafka"),
        (("audit", "--from", "-1h"), "audit", "kafka"),
    ],
)
def test_kafka_commands_name_their_extra(venv: Venv, args: tuple[str, ...], command: str, extra: str) -> None:
    out = venv.run("effects", *args)
    assert (out.returncode, out.stderr) == (1, missing_extra_line(command, extra))


EXTRAS = ["", "[kafka]"]  # our base install, and base + [kafka] (what an agent in Kafka mode installs)


@dataclass
class DryRun:
    """``pip install --dry-run --report`` of ``requirements`` into an empty environment
    (``--ignore-installed``: what is already in the venv does not count)."""

    requirements: tuple[str, ...]
    out: subprocess.CompletedProcess[str]
    report: Path

    def resolved(self) -> dict[str, str]:
        """``{distribution: version}`` pip would install."""
        assert self.out.returncode == 0, f"pip could not resolve {self.requirements}:\n{self.out.stderr[-3000:]}"
        items = json.loads(self.report.read_text())["install"]
        return {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"] for i in items}


@pytest.fixture(scope="module")
def dry_runs(venv: Venv, wheel: Path) -> dict[str, DryRun]:
    """The dry runs of DBOS alone ("alone") and of DBOS next to our wheel with each of ``EXTRAS``.
    Each keeps a pip busy for several seconds: they run side by side, and DBOS alone is resolved
    once for both tests."""
    wanted = {"alone": (DBOS,), **{extras: (DBOS, f"{wheel}{extras}") for extras in EXTRAS}}

    def dry_run(i: int, requirements: tuple[str, ...]) -> DryRun:
        report = venv.project.parent / f"report-{i}.json"
        out = venv.pip("install", "-q", "--dry-run", "--ignore-installed", "--report", str(report), *requirements)
        return DryRun(requirements, out, report)

    with ThreadPoolExecutor(len(wanted)) as pool:
        runs = {name: pool.submit(dry_run, i, reqs) for i, (name, reqs) in enumerate(wanted.items())}
        return {name: run.result() for name, run in runs.items()}


@pytest.mark.parametrize("extras", EXTRAS)
def test_install_next_to_dbos_downgrades_nothing(dry_runs: dict[str, DryRun], extras: str) -> None:
    """DBOS resolves to the same versions with our base install (or base + [kafka], what an agent
    in Kafka mode installs) added as without it. ([processor] cannot share an environment with
    DBOS 3.4: faust-streaming's mode-streaming pins croniter<6; pyproject.toml says so.)"""
    from packaging.version import Version

    alone = dry_runs["alone"].resolved()
    both = dry_runs[extras].resolved()
    assert alone["dbos"] == "3.4.0" and "croniter" in alone  # not vacuous: dbos and its deps resolved
    assert both["effect-ledger-kafka"] and ("confluent-kafka" in both) == (extras == "[kafka]")
    lower = {n: (v, both.get(n)) for n, v in alone.items() if n not in both or Version(both[n]) < Version(v)}
    assert lower == {}, f"installing effect-ledger-kafka{extras} next to {DBOS} downgrades {lower}"
