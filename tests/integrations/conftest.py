"""Frameworks that cannot share the processor's environment get their own: DBOS (it needs
croniter>=6.2.4, faust's mode-streaming pins croniter<6), CrewAI and Microsoft Agent Framework (each
heavy, and installing one extra must not pull another). ``make test`` runs tests/integrations/<name> a
second time in .venv-<name>; an environment without the framework leaves them to that run, and says
so in its header."""

from __future__ import annotations

import importlib.util

# folder -> (the module its framework installs, the environment `make test` runs it in)
OWN_ENVS = {
    "dbos": ("dbos", ".venv-dbos"),
    "crewai": ("crewai", ".venv-crewai"),
    "agent_framework": ("agent_framework", ".venv-agent-framework"),
}
MISSING = {folder: env for folder, (module, env) in OWN_ENVS.items() if importlib.util.find_spec(module) is None}
collect_ignore = list(MISSING)


def pytest_report_header() -> str | None:
    if not MISSING:
        return None
    return "; ".join(
        f"tests/integrations/{f}: not in this environment, `make test` runs them in {e}" for f, e in MISSING.items()
    )
