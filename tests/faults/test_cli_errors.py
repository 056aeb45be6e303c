"""Issue 10, item 14: every error a user can meet on the command line is one line on stderr and exit 1.

Every ``effects`` command is enumerated from the click group (a new command is covered without
editing this file) and run with bad arguments and bad files: an option that does not exist, a
missing required option, a file that is not a ledger, a folder that does not exist, a ledger with
garbage written over a page, times, durations, ports, store URLs and targets that are malformed, and a
broker address nobody listens on (with a short ``EFFECTS_BROKER_TIMEOUT``). Each run must end with exactly
one non-empty line on stderr, no traceback, exit status 1, and every file it was given unchanged, byte
for byte.

A bad value given to a Kafka command comes with the real broker's address, so that nothing but the
refusal of the value stands between it and its use (with a dead broker, the broker error came first
and hid, for example, the traceback of ``worker --web-port 99999``); the topics are under a fresh
prefix, deleted afterwards.

The cases run in process (click's ``CliRunner``), except those that talk to a broker: they run as
child processes, a few at a time, since only a real process shows what librdkafka writes to stderr,
and a command that wrongly accepted its value and started a service can be stopped.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from effect_ledger.core.keys import effect_key
from effect_ledger.streams.admin import delete_topics, list_topics
from effect_ledger.streams.config import KafkaConfig
from tests.incident import incident
from tests.ops_expected import now_ms, write_ledger

ROOT = Path(__file__).resolve().parents[2]
DEAD = "127.0.0.1:1"  # nothing listens on port 1: connections are refused at once
# Every command gives up on the dead broker after a second (``--broker-timeout``, by environment).
ENV = {"EFFECTS_BROKER_TIMEOUT": "1"}
KEY = effect_key("payments", "create", "incident-run", "step-5")  # in the ledger: effects 0-299


def commands(group: click.Group = main, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every runnable command under ``group``, with its path (``("topics", "create")``)."""
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


# -- the arguments: a baseline per command, then one bad value at a time --------------------------------

# By parameter name: the value that makes a command's required options complete. ``{ledger}`` etc. are
# the files of the ``files`` fixture. A flag is given by its option string alone.
BASELINE: dict[str, list[str]] = {
    "db": ["--db", "{ledger}"],
    "targets_spec": ["--targets", "{targets}"],
    "from_": ["--from", "-1h"],
    "key": ["{key}"],
    "by": ["--by", "a"],
    "reason": ["--reason", "r"],
    "absent": ["--absent"],
    "url": ["--to", "sqlite:///{tmp}/sink.db"],
    "bootstrap": ["--bootstrap", "{bootstrap}"],
    "prefix": ["--prefix", "{prefix}"],
    "once": ["--once"],  # run, sink: never a loop, should a bad value get through
    "count": ["--count", "1"],
}

# By parameter name: what a dead-broker case adds (demo: through Kafka, not embedded).
THROUGH_KAFKA: dict[str, list[str]] = {"kafka": ["--kafka"]}

# By parameter name: (what is wrong, the bad value).
BAD_VALUES: dict[str, list[tuple[str, str]]] = {
    "db": [("not a ledger", "{notes}"), ("missing folder", "{tmp}/no-such-folder/ledger.db"),
           ("corrupt page", "{corrupt}"), ("truncated", "{truncated}"), ("a FIFO", "{fifo}"),
           ("a device", "/dev/zero")],
    "from_": [("time out of range", "99999999999999999999999"), ("not a time", "yesterday-ish")],
    "to": [("time out of range", "99999999999999999999999")],
    "older_than": [("duration out of range", "9" * 40 + "d"), ("not a duration", "10 minutes")],
    "stuck_after": [("not a duration", "ten")],
    "web_port": [("port out of range", "99999"), ("port zero", "0")],
    "store": [("bad store URL", "bogus://")],
    "targets_spec": [("targets file missing", "{tmp}/no-such-targets.toml"), ("targets not TOML", "{notes}"),
                     ("targets a folder", "{tmp}"), ("targets no such module", "no_such_module:TARGETS"),
                     ("targets a FIFO", "{fifo}")],
    "log": [("log a FIFO", "{fifo}"), ("log a device", "/dev/zero")],
    "partitions": [("zero partitions", "0")],
    "interval": [("negative interval", "-1"), ("interval nan", "nan"), ("interval inf", "inf")],
    "timeout": [("negative timeout", "-1"), ("timeout nan", "nan"), ("timeout 1e309", "1e309"),
                ("timeout over a week", "1e300")],
    "give_up_after": [("negative give-up", "-1"), ("give-up nan", "nan"), ("give-up inf", "inf"),
                      ("give-up 1e309", "1e309")],
    "webhook_timeout": [("webhook timeout nan", "nan")],
    "count": [("negative count", "-1")],
    "loglevel": [("unknown log level", "banana")],
    "states": [("unknown state", "NOPE")],
    "web_host": [],
    # effects audit: only an http(s) console address makes a link (never javascript:, file:, ...)
    "console_url": [("console URL not http", "javascript:alert(1)"), ("console URL a file", "file:///etc/passwd"),
                    ("console URL without a host", "http://")],
    # effects init: a file already there (whatever it is) is refused and left as it was
    "targets_file": [("starter over a file", "{notes}"), ("starter over a ledger", "{ledger}"),
                     ("starter in a missing folder", "{tmp}/no-such-folder/targets.toml"),
                     ("starter over a FIFO", "{fifo}"), ("starter over a folder", "{tmp}")],
}  # fmt: skip


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    child: bool  # talks to a broker: a child process
    live: bool = False  # --bootstrap is the real broker (else the dead address)

    def formatted(self, names: dict[str, str]) -> list[str]:
        return [a.format(**names) for a in self.args]


def _flag(param: click.Parameter) -> str:
    assert isinstance(param, click.Option)
    return next(o for o in param.opts if o.startswith("--"))


def _baseline(cmd: click.Command) -> dict[str, list[str]]:
    names = {p.name for p in cmd.params}
    return {n: v for n, v in BASELINE.items() if n in names}


def _args(path: tuple[str, ...], parts: dict[str, list[str]]) -> tuple[str, ...]:
    return (*path, *(a for v in parts.values() for a in v))


def cases() -> list[Case]:
    out: list[Case] = []
    for path, cmd in commands():
        name = " ".join(path)
        base = _baseline(cmd)
        params = {p.name: p for p in cmd.params}
        # With --db the command reads the file, not Kafka: no broker is asked.
        kafka = "bootstrap" in params and "db" not in base
        out.append(Case(f"{name}: unknown option", _args(path, {**base, "x": ["--no-such-option"]}), False))
        if any(p.required for p in cmd.params):
            out.append(Case(f"{name}: missing required option", path, False))
        for pname, bad in BAD_VALUES.items():
            if pname not in params:
                continue
            for what, value in bad:
                parts = dict(base)
                param = params[pname]
                flag = pname.upper() if isinstance(param, click.Argument) else _flag(param)
                parts[pname] = [value] if isinstance(param, click.Argument) else [flag, value]
                out.append(Case(f"{name}: {flag} {what}", _args(path, parts), child=kafka, live=kafka))
        if "bootstrap" in params:
            parts = {k: v for k, v in base.items() if k != "db"}
            parts.update({k: v for k, v in THROUGH_KAFKA.items() if k in params})
            out.append(Case(f"{name}: dead broker", _args(path, parts), child=True))
    return out


CASES = cases()


def test_every_command_is_covered() -> None:
    """Each command gets at least an unknown option and one bad value or file; the Kafka ones a dead
    broker too."""
    for path, cmd in commands():
        name = " ".join(path)
        mine = [c for c in CASES if c.id.startswith(f"{name}: ")]
        assert len(mine) >= 2, f"{name}: only {[c.id for c in mine]}"
        if any(p.name == "bootstrap" for p in cmd.params):
            assert any(c.id == f"{name}: dead broker" for c in mine), name


# -- the files --------------------------------------------------------------------------------------


def corrupt(path: Path) -> None:
    """Garbage over the root page of the events and effects tables: every read of them fails."""
    with sqlite3.connect(path) as conn:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        roots = dict(conn.execute("SELECT name, rootpage FROM sqlite_master WHERE name IN ('events', 'effects')"))
    conn.close()
    with path.open("r+b") as f:
        for root in roots.values():
            f.seek((root - 1) * page)
            f.write(b"\xde\xad\xbe\xef" * (page // 4))


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("originals")
    events = incident(now_ms()).events[:900]  # 300 effects: a ledger of several pages per table
    write_ledger(d / "ledger.db", events)
    shutil.copy(d / "ledger.db", d / "corrupt.db")
    corrupt(d / "corrupt.db")
    # A WAL-mode ledger cut short: a read-only connection to it created -wal and -shm beside it.
    (d / "truncated.db").write_bytes((d / "ledger.db").read_bytes()[:8192])
    (d / "notes.txt").write_text("these are my notes, not a ledger\n")
    (d / "targets.toml").write_text('[targets.payments]\nlookup = "none"\n\n[targets.tickets]\nlookup = "none"\n')
    return d


def copy_files(originals: Path, d: Path, bootstrap: str = DEAD, prefix: str = "nobody.") -> dict[str, str]:
    """A fresh copy of every file per case, so one command that writes cannot hide another's."""
    for f in originals.iterdir():
        shutil.copy(f, d / f.name)
    os.mkfifo(d / "fifo")  # opened for reading, it waits for a writer: for ever
    names = {k: str(d / f) for k, f in FILES.items()}
    return {**names, "tmp": str(d), "key": KEY, "bootstrap": bootstrap, "prefix": prefix, "fifo": str(d / "fifo")}


FILES = {"ledger": "ledger.db", "corrupt": "corrupt.db", "notes": "notes.txt", "targets": "targets.toml",
         "truncated": "truncated.db"}  # fmt: skip


@pytest.fixture
def files(originals: Path, tmp_path: Path) -> dict[str, str]:
    return copy_files(originals, tmp_path)


def snapshot(names: dict[str, str]) -> dict[str, bytes]:
    """The files given, byte for byte, and the names in their folder: a refused file gets no
    ``-wal``/``-shm`` beside it, and nothing else is created there."""
    return {
        **{k: Path(names[k]).read_bytes() for k in FILES},
        "folder": "\0".join(sorted(os.listdir(names["tmp"]))).encode(),
    }


class FifoWatch:
    """Lets a command blocked opening the FIFO go on (opens it for writing, again and again, from
    ``after`` seconds on) and says whether it had to: a FIFO must be refused, not waited on."""

    def __init__(self, fifo: str, after: float = 10.0) -> None:
        self.fifo, self.after, self.released = fifo, after, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.after):
            return
        while not self._stop.is_set():
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
                self.released = True
            except OSError:
                pass  # nobody is reading it
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def check(case: Case, code: int, out: str, err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in out + err, f"{case.id}: a traceback\n{err}"
    assert code == 1, f"{case.id}: exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert len(lines) == 1 and lines[0].startswith("effects: "), f"{case.id}: stderr is not one line:\n{err}"


@pytest.mark.parametrize("case", [c for c in CASES if not c.child], ids=lambda c: c.id)
def test_bad_arguments_and_files_are_one_line_and_exit_1(case: Case, files: dict[str, str]) -> None:
    before = snapshot(files)
    watch = FifoWatch(files["fifo"])
    try:
        r = CliRunner().invoke(main, case.formatted(files), env=ENV)
    finally:
        watch.stop()
    assert not watch.released, f"{case.id}: waited on the FIFO for {watch.after} s"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"{case.id}: {type(r.exception).__name__}: {r.exception}") from r.exception
    check(case, r.exit_code, r.stdout, r.stderr)
    assert snapshot(files) == before, f"{case.id}: a file it was given, or its folder, changed"


# -- options of the group, and bad combinations -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--broker-timeout", "nan"], {}),
        (["--broker-timeout", "inf"], {}),
        (["--broker-timeout", "1e309"], {}),
        ([], {"EFFECTS_BROKER_TIMEOUT": "nan"}),
        ([], {"EFFECTS_BROKER_TIMEOUT": "-inf"}),
    ],
    ids=["nan", "inf", "1e309", "env nan", "env -inf"],
)
def test_a_broker_timeout_that_is_not_finite_is_refused(
    args: list[str], env: dict[str, str], files: dict[str, str]
) -> None:
    """``--broker-timeout nan`` passed every comparison of its range, and ``inf`` had none: a
    command waiting on a broker then waited for ever. Refused whatever the command."""
    case = Case(f"broker-timeout {args or env}", (), False)
    before = snapshot(files)
    r = CliRunner().invoke(main, [*args, "escalations", "--db", files["ledger"]], env={**ENV, **env})
    check(case, r.exit_code, r.stdout, r.stderr)
    assert "finite" in r.stderr or "range" in r.stderr, r.stderr
    assert snapshot(files) == before


@pytest.mark.parametrize(
    "decisions",
    [["--abandon", "--absent"], ["--absent", "--abandon"], ["--confirmed", "--receipt", "re_1", "--abandon"],
     ["--absent", "--compensated"]],
    ids=lambda d: " ".join(d),
)  # fmt: skip
def test_resolve_with_two_decisions_is_a_usage_error_and_writes_nothing(
    decisions: list[str], files: dict[str, str]
) -> None:
    """Given two decisions at once, the last flag won (``--abandon --absent`` recorded ABSENT)."""
    case = Case(f"resolve {' '.join(decisions)}", (), False)
    before = snapshot(files)
    args = ["resolve", files["key"], "--db", files["ledger"], *decisions, "--by", "a", "--reason", "r"]
    r = CliRunner().invoke(main, args, env=ENV)
    check(case, r.exit_code, r.stdout, r.stderr)
    assert "one decision at a time" in r.stderr, r.stderr
    assert snapshot(files) == before, "a decision was written"


@pytest.fixture(scope="module")
def child_runs(
    originals: Path, tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str
) -> Iterator[dict[str, tuple[int, str, str]]]:
    """Every case that talks to a broker as a child process, four at a time: (exit status, stdout,
    stderr) by id. A file it was given, and its folder, must be unchanged."""
    prefix = f"t{uuid.uuid4().hex[:12]}."

    def run(case: Case) -> tuple[int, str, str]:
        d = tmp_path_factory.mktemp("child")
        names = copy_files(originals, d, kafka_bootstrap if case.live else DEAD, prefix)
        before = snapshot(names)
        try:
            r = subprocess.run(
                [sys.executable, "-m", "effect_ledger", *case.formatted(names)],
                cwd=d,
                env=dict(os.environ, PYTHONPATH=str(ROOT), **ENV),
                capture_output=True,
                text=True,
                timeout=90,
            )
            code, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = -1, str(e.stdout or ""), f"{e.stderr or ''}\n(still running after 90 s: killed)"
        if snapshot(names) != before:
            err += "\n(a file it was given changed)"
        return code, out, err

    children = [c for c in CASES if c.child]
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip((c.id for c in children), pool.map(run, children), strict=True))
    try:
        yield results
    finally:  # what a command that wrongly accepted its value may have created
        cfg = KafkaConfig(bootstrap=kafka_bootstrap)
        delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(prefix)])


@pytest.mark.parametrize("case", [c for c in CASES if c.child], ids=lambda c: c.id)
def test_commands_that_talk_to_a_broker_are_one_line_and_exit_1(
    case: Case, child_runs: dict[str, tuple[int, str, str]]
) -> None:
    code, out, err = child_runs[case.id]
    check(case, code, out, err)
    assert "(a file it was given changed)" not in err, case.id
    assert "%3|" not in err, f"{case.id}: librdkafka's own log lines on stderr:\n{err}"
