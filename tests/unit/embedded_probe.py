"""What a user of the base install does, as one script: import the whole public API, execute an
effect through ``Ledger`` and ``SyncLedger``, run the embedded commands of ``effects``, and ask for
Kafka mode. Prints one JSON object: what happened and which Kafka modules got imported.

Run as ``python -c SOURCE [block]`` (``tests/unit/test_packaging.py`` in the dev venv,
``tests/unit/test_wheel.py`` in a venv holding only the built wheel): ``-c`` puts the working
directory first on ``sys.path``, as it is for a user's own script next to their ``schemas.py``.
With ``block``, the optional Kafka modules are made unimportable first, as in the base install.
It imports nothing from ``tests``: the wheel's venv has no repository."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

KAFKA_MODULES = ("confluent_kafka", "faust", "aiokafka", "rocksdict")

if "block" in sys.argv[1:]:
    for name in KAFKA_MODULES:
        sys.modules[name] = None  # type: ignore[assignment]  # "import faust" -> ModuleNotFoundError

import effect_ledger  # noqa: E402
from effect_ledger import *  # noqa: E402, F403

report: dict[str, object] = {"file": effect_ledger.__file__}
report["unresolved"] = [n for n in effect_ledger.__all__ if n not in globals()]

work = Path(tempfile.mkdtemp(prefix="effect-ledger-probe-"))
declaration = work / "targets.toml"
declaration.write_text('[targets.payments]\nlookup = "none"\n')


async def embedded() -> dict[str, object]:
    async with await effect_ledger.Ledger.open(str(work / "a.db"), targets=str(declaration)) as ledger:
        first = await ledger.execute(
            target="payments",
            operation="refund.create",
            run_id="run-1",
            step="refund-123",
            request={"order": "123", "amount": 4800},
            call=lambda key: {"id": "re_1", "key": key},
        )
        again = await ledger.execute(
            target="payments",
            operation="refund.create",
            run_id="run-1",
            step="refund-123",
            request={"order": "123", "amount": 4800},
            call=lambda key: {"id": "re_2"},
        )
    return {"receipt": first.receipt_id, "called": first.called, "again": [again.receipt_id, again.called]}


report["ledger"] = asyncio.run(embedded())

with effect_ledger.SyncLedger.open(str(work / "b.db"), targets=str(declaration)) as sync_ledger:
    c = sync_ledger.execute(
        target="payments",
        operation="refund.create",
        run_id="run-2",
        step="refund-456",
        request={"order": "456"},
        call=lambda key: {"id": "re_3"},
    )
    report["sync_ledger"] = c.receipt_id
key = effect_ledger.effect_key("payments", "refund.create", "run-1", "refund-123")

# The operator CLI's embedded commands, in process.
from click.testing import CliRunner  # noqa: E402

from effect_ledger.cli.main import main  # noqa: E402

db = str(work / "a.db")
commands = {
    "help": ["--help"],
    "audit": ["audit", "--db", db, "--from", "-1h", "--json"],
    "stuck": ["stuck", "--db", db, "--older-than", "0s"],
    "trace": ["trace", key, "--db", db, "--json"],
    "escalations": ["escalations", "--db", db],
    "run": ["run", "--db", db, "--targets", str(declaration), "--once"],
}
report["cli"] = {
    name: {"exit": r.exit_code, "output": r.output[-20000:], "error": repr(r.exception) if r.exit_code > 3 else None}
    for name, args in commands.items()
    for r in [CliRunner().invoke(main, args)]
}

# Kafka mode needs the [kafka] extra. Without it: MissingExtra, and the file is never created.
kafka_db = work / "kafka.db"
if importlib.util.find_spec("confluent_kafka") is None:
    try:
        asyncio.run(effect_ledger.Ledger.open(str(kafka_db), targets=str(declaration), kafka="127.0.0.1:1"))
        report["kafka_mode"] = "opened"
    except effect_ledger.MissingExtra as e:
        report["kafka_mode"] = {"error": type(e).__name__, "extra": e.extra, "message": str(e)}
    report["kafka_db_created"] = kafka_db.exists()

report["kafka_modules"] = sorted(
    {n.partition(".")[0] for n, m in sys.modules.items() if m is not None and n.partition(".")[0] in KAFKA_MODULES}
)
print(json.dumps(report))
