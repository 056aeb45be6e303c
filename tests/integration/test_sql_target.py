"""kind = "sql" against a SQLite file and a real PostgreSQL server (tests/postgres.py): the key
column guarding an insert (ON CONFLICT DO NOTHING RETURNING), the stock decrement that never goes
negative, the lookup by key, the ledger's receipt, and what is refused before anything is sent."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from effect_ledger.core.model import State
from effect_ledger.core.reconcile import Absent, EffectView, Found, Unknown
from effect_ledger.errors import DestinationError, OutOfStock, TargetsError
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.targets.load import parse_targets
from effect_ledger.targets.sql import SqlDestination
from tests.destinations import SqlDb
from tests.sdk_contract import run

T0 = 1_700_000_000_000


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> SqlDb:
    if request.param == "sqlite":
        return SqlDb(f"sqlite:///{tmp_path}/shop.db")
    return SqlDb(request.getfixturevalue("postgres_url"))


def dest(db: SqlDb) -> SqlDestination:
    target = parse_targets(db.declaration())[0]
    assert isinstance(target.reconciler, SqlDestination)
    return target.reconciler


def view(key: str) -> EffectView:
    return EffectView(key, "orders", "stock.take", {}, 1, T0, T0 + 10_000)


def test_an_insert_is_guarded_by_its_key_and_found_by_it(db: SqlDb) -> None:
    d, key = dest(db), f"orders:{uuid.uuid4().hex}"
    assert isinstance(run(d.check(view(key))), Absent)
    first = run(d.insert(key, {"order_id": "123", "item": "sku-9", "quantity": 1}))
    again = run(d.insert(key, {"order_id": "123", "item": "sku-9", "quantity": 1}))
    assert first == again == {"table": db.table, "id": first["id"]}
    assert [(r[0], r[1]) for r in db.rows(key)] == [(first["id"], key)]
    assert run(d.check(view(key))) == Found(str(first["id"]), {"table": db.table, "id": first["id"]})


def test_a_stock_decrement_is_taken_once_per_key_and_never_below_zero(db: SqlDb) -> None:
    d = dest(db)
    a, b = f"orders:{uuid.uuid4().hex}", f"orders:{uuid.uuid4().hex}"
    taken = run(d.decrement(a, "sku-1", 4, {"order_id": "1"}))
    assert run(d.decrement(a, "sku-1", 4, {"order_id": "1"})) == taken and db.on_hand() == 6
    with pytest.raises(OutOfStock):
        run(d.decrement(b, "sku-1", 7, {"order_id": "2"}))
    assert db.on_hand() == 6 and db.rows(b) == []  # rolled back together: no movement row either
    assert isinstance(run(d.check(view(b))), Absent)
    with pytest.raises(OutOfStock):  # an item the stock does not hold has none of it
        run(d.decrement(b, "sku-404", 1))


def test_through_the_ledger_the_receipt_is_the_row_id_and_out_of_stock_is_failed(db: SqlDb, tmp_path: Path) -> None:
    targets = tmp_path / "targets.toml"
    targets.write_text(db.declaration())
    run_id = uuid.uuid4().hex

    async def body() -> tuple[str, str, State | None]:
        async with await Ledger.open(str(tmp_path / "effects.db"), targets=targets) as ledger:
            d = ledger.target("orders").reconciler
            assert isinstance(d, SqlDestination)
            ok = await ledger.execute(
                target="orders", operation="stock.take", run_id=run_id, step="s1", request={},
                call=lambda key: d.decrement(key, "sku-1", 3),
            )  # fmt: skip
            with pytest.raises(OutOfStock):
                await ledger.execute(
                    target="orders", operation="stock.take", run_id=run_id, step="s2", request={},
                    call=lambda key: d.decrement(key, "sku-1", 8),
                )  # fmt: skip
            failed = await ledger.get(_key(run_id, "s2"))
            return ok.effect_id, ok.receipt_id, failed.state if failed else None

    key, receipt, failed = run(body())
    assert receipt == str(db.rows(key)[0][0]) and db.on_hand() == 7 and failed == State.FAILED


def _key(run_id: str, step: str) -> str:
    from effect_ledger.core.keys import effect_key

    return effect_key("orders", "stock.take", run_id, step)


def test_rows_it_cannot_write_are_refused_before_anything_is_sent(db: SqlDb) -> None:
    d, key = dest(db), f"orders:{uuid.uuid4().hex}"
    for row in ({"order_id; DROP TABLE x": "1"}, {"order_id": object()}, {f"c{i}": 1 for i in range(65)}):
        with pytest.raises(DestinationError):
            run(d.insert(key, row))
    with pytest.raises(DestinationError):
        run(d.decrement(key, "sku-1", -1))
    assert db.rows(key) == [] and db.on_hand() == 10


def test_a_missing_sqlite_file_is_unknown_and_is_never_created(tmp_path: Path) -> None:
    missing = tmp_path / "gone.db"
    d = SqlDestination(f"sqlite:///{missing}", "shipments")
    answer = run(d.check(view("orders:k")))
    assert isinstance(answer, Unknown) and not missing.exists()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ('table = "ship ments"', "plain SQL name"),
        ('database = "mysql://db/shop"', "sqlite:////ABSOLUTE/PATH or postgresql://"),
        ('stock = { table = "stock", sku = "item" }', "stock must be a table"),
        ('lookup = "none"', 'kind = "sql" is its own lookup'),
    ],
)
def test_targets_file_mistakes_name_the_line(setting: str, message: str, tmp_path: Path) -> None:
    text = SqlDb(f"sqlite:///{tmp_path}/shop.db").declaration()
    field = setting.split(" ")[0]
    lines = text.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith(f"{field} ")), len(lines))
    lines[at : at + 1] = [setting]  # in place of the setting, or added at the end
    with pytest.raises(TargetsError) as e:
        parse_targets("\n".join(lines) + "\n", "t.toml")
    assert message in str(e.value) and str(e.value).startswith(f"t.toml:{at + 1}:")
