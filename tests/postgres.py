"""A real PostgreSQL server in a temporary folder, for the sink's tests.

Debian's server binaries (``scripts/install-postgres.sh`` installs them): ``initdb`` a cluster in
a fresh folder, ``pg_ctl start -w`` it on 127.0.0.1 and a free port (its socket in the same folder),
``pg_ctl stop -w`` it afterwards. ``initdb`` and ``postgres`` refuse to run as root, so as root
they run as ``nobody`` (``runuser``), the folder owned by it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One throwaway cluster; ``url`` connects to its ``postgres`` database as superuser."""

    USER = "postgres"

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb: run scripts/install-postgres.sh")
        self.bin = bin_dir
        # Not under pytest's tmp folders: those are 0700 and `nobody` could not reach the cluster.
        self.root = Path(tempfile.mkdtemp(prefix="effects-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, "nobody")
        self.root.chmod(0o700)

    @property
    def url(self) -> str:
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", "nobody", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def _check(self, r: subprocess.CompletedProcess[str], what: str) -> None:
        if r.returncode != 0:
            raise RuntimeError(f"{what} failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")

    def start(self) -> PostgresServer:
        r = self._run("initdb", "-D", str(self.data), "-U", self.USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        self._check(r, "initdb")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        # -w: pg_ctl returns once the server accepts connections (or fails), no guessing.
        r = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "start")
        if r.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed:\n{r.stderr}\n{self.log()}")
        return self

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        try:
            if self.data.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
