"""A new user's first commands: ``effects init`` writes the starter targets file the README's example
reads (package data, never overwriting a file), and ``effects demo`` leaves its ledger file and ends
with three commands that work as printed on it. Real child processes, real files, the real console
over loopback HTTP."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from effect_ledger.cli.init import starter_text
from effect_ledger.targets.load import load_targets

ROOT = Path(__file__).resolve().parents[2]
EFFECTS = Path(sys.executable).with_name("effects")  # the console script of the environment under test


def effects(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    env.pop("EFFECTS_CONSOLE_URL", None)
    return subprocess.run([str(EFFECTS), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# -- effects init ------------------------------------------------------------------------------------


def test_init_writes_a_starter_that_loads(tmp_path: Path) -> None:
    r = effects("init", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "targets.toml"
    assert path.read_text() == starter_text()
    targets = load_targets(path)
    assert [t.name for t in targets] == ["payments"] and targets[0].reconciler is None  # lookup = "none"
    assert "wrote targets.toml" in r.stdout


def test_init_never_overwrites_a_file(tmp_path: Path) -> None:
    path = tmp_path / "targets.toml"
    path.write_text("[targets.mine]\nlookup = 'none'\n")
    before = path.stat()
    r = effects("init", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "effects: targets.toml already exists: effects init never overwrites a file"
    ]
    assert path.read_text() == "[targets.mine]\nlookup = 'none'\n" and path.stat().st_mtime_ns == before.st_mtime_ns


def test_init_does_not_follow_a_dangling_symlink_or_write_into_a_folder(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "targets.toml"
    link.symlink_to(tmp_path / "elsewhere" / "created.toml")
    r = effects("init", cwd=tmp_path)
    assert r.returncode == 1 and "already exists" in r.stderr
    assert not (tmp_path / "elsewhere" / "created.toml").exists()
    r = effects("init", "--targets", "elsewhere", cwd=tmp_path)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_init_writes_where_told(tmp_path: Path) -> None:
    r = effects("init", "--targets", "conf/t.toml", cwd=tmp_path)
    assert r.returncode == 1 and "conf/t.toml: cannot create it" in r.stderr  # no folder is made
    (tmp_path / "conf").mkdir()
    assert effects("init", "--targets", "conf/t.toml", cwd=tmp_path).returncode == 0
    assert (tmp_path / "conf/t.toml").read_text() == starter_text()


def test_the_starter_is_package_data() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "starter.toml" in data["effect_ledger.targets"]
    assert (ROOT / "effect_ledger/targets/starter.toml").read_text() == starter_text()


# -- effects demo hands over -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bare_env() -> dict[str, str]:
    """A fresh shell's environment: the PATH without the environment under test (never activated)."""
    env = dict(os.environ, COLUMNS="200")
    env.pop("EFFECTS_CONSOLE_URL", None)
    env.pop("VIRTUAL_ENV", None)
    folders = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).absolute() != EFFECTS.parent]
    env["PATH"] = os.pathsep.join(folders) or os.defpath
    return env


def shell(command: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``command`` as a user pastes it into a fresh shell (no activated environment)."""
    return subprocess.run(
        ["/bin/sh", "-c", command], cwd=cwd, env=_bare_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """``effects demo`` run once in an empty folder from a shell whose PATH does not reach ``effects``
    (as after ``make demo``): that folder and the three commands it printed."""
    cwd = tmp_path_factory.mktemp("demo")
    r = subprocess.run([str(EFFECTS), "demo"], cwd=cwd, env=_bare_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if "The ledger is left in effects-demo.db" in ln)
    commands = [ln.strip() for ln in lines[start + 1 :] if ln.startswith("  ") and " --db " in ln]
    return cwd, commands


def test_demo_leaves_its_ledger_and_names_three_commands(demo: tuple[Path, list[str]]) -> None:
    cwd, commands = demo
    assert (cwd / "effects-demo.db").is_file()
    assert not (cwd / "effects-demo.db.tmp").exists()
    # not on the PATH: the commands name the very program that ran, by its path
    assert [shlex.split(c)[:2] for c in commands] == [
        [str(EFFECTS), "trace"],
        [str(EFFECTS), "console"],
        [str(EFFECTS), "audit"],
    ]


def test_the_printed_trace_and_audit_work_as_printed(demo: tuple[Path, list[str]]) -> None:
    cwd, commands = demo
    trace, _, audit = commands
    assert shutil.which("effects", path=_bare_env()["PATH"]) != str(EFFECTS)  # a bare `effects` would miss
    r = shell(trace, cwd)  # pasted as printed, into a shell that never activated the environment
    assert r.returncode == 0, r.stderr
    assert "state: CONFIRMED" in r.stdout and "FOUND re_0001" in r.stdout
    r = shell(audit + " --json", cwd)
    assert r.returncode == 0, r.stderr  # piped, so a failed check would exit 1
    assert '"passed": true' in r.stdout and '"events": 3' in r.stdout


def test_the_commands_say_effects_when_the_path_finds_this_program(tmp_path: Path) -> None:
    from effect_ledger.demo.story import program

    assert program(str(EFFECTS.parent), str(tmp_path)) == "effects"
    other = tmp_path / "bin"
    other.mkdir()
    (other / "effects").write_text("#!/bin/sh\nexit 3\n")  # another install's `effects` first on the PATH
    (other / "effects").chmod(0o755)
    assert program(str(other), str(tmp_path)) == str(EFFECTS)
    assert program("", str(EFFECTS.parent.parent)) == f"{EFFECTS.parent.name}/effects"  # `.venv/bin/effects`


def test_the_printed_console_serves_the_effect(demo: tuple[Path, list[str]]) -> None:
    cwd, commands = demo
    serve = commands[1]
    key = shlex.split(commands[0])[2]
    port = _free_port()  # the printed command listens on 8080; a test must not take a shared port
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"exec {serve} --port {port}"], cwd=cwd, env=_bare_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/trace/{key}", timeout=5) as resp:
                    body = resp.read().decode()
                    break
            except OSError:
                time.sleep(0.1)  # polling a server that is starting, under a deadline
        assert "CONFIRMED" in body, (proc.poll(), body)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_second_demo_replaces_the_first_ones_ledger(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    first, _ = demo
    shutil.copy(first / "effects-demo.db", tmp_path / "effects-demo.db")
    (tmp_path / "effects-demo.db-wal").write_bytes(b"a stale write-ahead log")  # never applied to the new file
    r = effects("demo", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert not (tmp_path / "effects-demo.db-wal").exists()
    trace = next(ln.strip() for ln in r.stdout.splitlines() if ln.startswith("  ") and " trace " in ln)
    t = shell(trace, tmp_path)
    assert t.returncode == 0 and "state: CONFIRMED" in t.stdout, t.stderr


@pytest.mark.parametrize("content", [b"my own notes\n", b""], ids=["a file of mine", "an empty file"])
def test_the_demo_never_replaces_a_file_that_is_not_its_own(tmp_path: Path, content: bytes) -> None:
    mine = tmp_path / "effects-demo.db"
    mine.write_bytes(content)
    r = effects("demo", cwd=tmp_path, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "effects: effects-demo.db is there and is not an earlier demo's ledger: effects demo replaces only its own file"
    ]
    assert "refund" not in r.stdout  # refused before anything ran
    assert mine.read_bytes() == content and sorted(p.name for p in tmp_path.iterdir()) == ["effects-demo.db"]


def test_the_demo_never_replaces_another_ledger(tmp_path: Path) -> None:
    """A ledger of the README's example is a ledger, but not the demo's: refused, left as it was."""
    other = tmp_path / "effects.db"
    script = (
        "from effect_ledger import SyncLedger, Target\n"
        "with SyncLedger.open('effects.db', targets=[Target('payments')]) as l:\n"
        "    l.execute(target='payments', operation='refund.create', run_id='o', step='s', request={},"
        " call=lambda key: {'id': 'r1'})\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, timeout=60)
    before = other.read_bytes()
    r = effects("demo", "--db", "effects.db", cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and "not an earlier demo's ledger" in r.stderr
    assert other.read_bytes() == before
