"""Frameworks that cannot share the processor's environment get their own: DBOS (it needs
croniter>=6.2.4, faust's mode-streaming pins croniter<6), and the OpenAI Agents SDK, Pydantic AI,
CrewAI and Microsoft Agent Framework (installing one extra must not pull another). ``make test`` runs
tests/integrations/<name> a second time in .venv-<name>; an environment without the framework leaves
them to that run, and says so in its header."""

from __future__ import annotations

import importlib.util

# test folder -> (the module its framework installs, the environment `make test` runs it in)
FRAMEWORKS = {
    "dbos": ("dbos", ".venv-dbos"),
    "openai_agents": ("agents", ".venv-openai-agents"),
    "pydantic_ai": ("pydantic_ai", ".venv-pydantic-ai"),
    "crewai": ("crewai", ".venv-crewai"),
    "agent_framework": ("agent_framework", ".venv-agent-framework"),
}
MISSING = {d: venv for d, (pkg, venv) in FRAMEWORKS.items() if importlib.util.find_spec(pkg) is None}
collect_ignore = sorted(MISSING)


def pytest_report_header() -> str | None:
    if not MISSING:
        return None
    return "; ".join(
        f"tests/integrations/{d}: not in this environment; `make test` runs them in {v}" for d, v in MISSING.items()
    )
