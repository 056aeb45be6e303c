"""DBOS cannot share the processor's environment (DBOS needs croniter>=6.2.4, faust's
mode-streaming pins croniter<6): ``make test`` runs tests/integrations/dbos a second time, in
.venv-dbos. An environment without DBOS leaves them to that run, and says so in its header."""

from __future__ import annotations

import importlib.util

HAS_DBOS = importlib.util.find_spec("dbos") is not None
collect_ignore = [] if HAS_DBOS else ["dbos"]


def pytest_report_header() -> str | None:
    return None if HAS_DBOS else "tests/integrations/dbos: not in this environment; `make test` runs them in .venv-dbos"
