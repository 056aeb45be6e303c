"""audit_replay: ``effects audit --from T --to T`` over a replayed window of effects.events.

Not yet available: the audit is being built. When it lands, replace the body of ``run`` with the
benchmark (fill a fresh topic set, time the audit, return a ``BenchResult``); it is already
registered in ``tests/bench/__main__.py`` and shown in the table.
"""

from __future__ import annotations

from tests.bench.common import BenchResult, Context, Skip


def run(ctx: Context) -> BenchResult:
    raise Skip("not yet available: effects audit is being built")
