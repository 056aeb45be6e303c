"""``effects console`` on a port another process holds: one line on stderr, exit 1, and no address
printed before (the address is shown only once the console's socket is bound). A real child process
and a real socket over loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.ops_expected import write_ledger

EFFECTS = Path(sys.executable).with_name("effects")


def test_a_taken_port_is_one_line_and_no_address(tmp_path: Path) -> None:
    db = write_ledger(tmp_path / "incident.db", [])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = subprocess.run(
            [str(EFFECTS), "console", "--db", str(db), "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"effects: cannot listen on 127.0.0.1:{port}"), r.stderr
    assert "effects console on" not in r.stdout, r.stdout  # nothing claims to serve where it does not
