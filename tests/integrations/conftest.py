"""Each agent framework's tests run where that framework is installed. DBOS cannot share the
processor's environment (DBOS needs croniter>=6.2.4, faust's mode-streaming pins croniter<6), and the
OpenAI Agents SDK and Pydantic AI are extras of their own: ``make test`` runs tests/integrations/dbos,
tests/integrations/openai_agents and tests/integrations/pydantic_ai again in .venv-dbos,
.venv-openai-agents and .venv-pydantic-ai. An environment without one of them leaves its tests to
that run, and says so in its header."""

from __future__ import annotations

import importlib.util

# test folder -> the package it needs and the virtualenv `make test` runs it in
FRAMEWORKS = {
    "dbos": ("dbos", ".venv-dbos"),
    "openai_agents": ("agents", ".venv-openai-agents"),
    "pydantic_ai": ("pydantic_ai", ".venv-pydantic-ai"),
}
MISSING = {d: venv for d, (pkg, venv) in FRAMEWORKS.items() if importlib.util.find_spec(pkg) is None}
collect_ignore = sorted(MISSING)


def pytest_report_header() -> str | None:
    if not MISSING:
        return None
    return "; ".join(
        f"tests/integrations/{d}: not in this environment; `make test` runs them in {v}" for d, v in MISSING.items()
    )
