"""The engines are extras: importing the SDK, the CLI or the shared decision code never imports
LangGraph or DBOS (the DBOS extra cannot even share an environment with the processor extra)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import effect_ledger, effect_ledger.cli.main, effect_ledger.integrations.decisions
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core', 'dbos'))
assert not loaded, loaded
"""


def test_the_core_does_not_import_the_engines() -> None:
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
