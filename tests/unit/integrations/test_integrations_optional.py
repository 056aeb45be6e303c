"""The engines are extras: importing the SDK, the CLI or the shared decision and tool code never
imports LangGraph, DBOS, the OpenAI Agents SDK or Pydantic AI (the DBOS extra cannot even share an
environment with the processor extra)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import effect_ledger, effect_ledger.cli.main, effect_ledger.integrations.decisions, effect_ledger.integrations._tools
engines = ('langgraph', 'langchain_core', 'dbos', 'agents', 'openai', 'pydantic_ai')
loaded = sorted(m for m in sys.modules if m.split('.')[0] in engines)
assert not loaded, loaded
"""


def test_the_core_does_not_import_the_engines() -> None:
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
