"""The key rule and the canonical request form (``effect_ledger.core.keys``).

The vectors below pin ``effect_key``: a change to the rule turns every replay of an old run into a
second effect, so it must fail the build.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effect_ledger.core.keys import (
    MAX_KEY_LENGTH,
    canonical_json,
    check_key,
    check_name,
    checked_effect_key,
    digest,
    effect_key,
)
from effect_ledger.errors import InvalidEffect

# NEVER CHANGE: these keys are stored in ledgers and sent to destinations as idempotency keys.
# Each was computed once and cross-checked by hand as sha256 of the UTF-8 JSON array
# [namespace, run_id, step, operation] with no whitespace and non-ASCII kept as is.
KEY_VECTORS = [
    # (target, operation, run_id, step, namespace or None for the default) -> key
    (
        ("payments", "refund.create", "run-1", "refund-order-123", None),
        "payments:5ca1d0a868445a9a41beb17d33bc3d8ea2f3de9789b6c6661ffe166f78f5f777",
    ),
    (
        ("payments", "refund.create", "run-1", "refund-order-123", "shop-eu"),
        "payments:12c5cfad2b65d355ee388d4597c87d1b9f930771d9875f739a90db8db9abe7c5",
    ),
    (
        ("mail", "send", "Lauf-ä-返金-😀", "notify", None),
        "mail:2167fa817404cfcc078cb3ad82f05a02d9eed773ffc71451919f4627bdf72f94",
    ),
]

KEY_SHAPE = re.compile(r"^(?P<target>[^:]+):(?P<digest>[0-9a-f]{64})$")
BASE = {
    "target": "payments",
    "operation": "refund.create",
    "run_id": "run-1",
    "step": "refund-order-123",
    "namespace": "default",
}


def key_of(**over: str) -> str:
    args = {**BASE, **over}
    return effect_key(args["target"], args["operation"], args["run_id"], args["step"], namespace=args["namespace"])


# --- the key rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "expected"), KEY_VECTORS, ids=["default-ns", "shop-eu-ns", "non-ascii-run"])
def test_key_vectors_never_change(args: tuple[str, str, str, str, str | None], expected: str) -> None:
    target, operation, run_id, step, namespace = args
    if namespace is None:
        key = effect_key(target, operation, run_id, step)
    else:
        key = effect_key(target, operation, run_id, step, namespace=namespace)
    assert key == expected


@pytest.mark.parametrize(("args", "expected"), KEY_VECTORS, ids=["default-ns", "shop-eu-ns", "non-ascii-run"])
def test_the_unchecked_key_of_execute_gives_the_same_vectors(
    args: tuple[str, str, str, str, str | None], expected: str
) -> None:
    # Ledger.execute checks the identifiers once and derives the key with checked_effect_key.
    target, operation, run_id, step, namespace = args
    assert checked_effect_key(target, operation, run_id, step, namespace or "default") == expected


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63, max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_canonical_json_is_json_dumps_with_the_canonical_options(value: object) -> None:
    # One shared encoder replaces json.dumps(...) per call: a digest must not change by a byte.
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert canonical_json(value) == expected


def test_the_default_namespace_is_default() -> None:
    assert effect_key("payments", "refund.create", "run-1", "refund-order-123") == key_of(namespace="default")


def test_key_rule_is_sha256_of_the_json_array() -> None:
    """The documented rule, recomputed independently of effect_ledger.core.keys."""
    material = '["default","Lauf-ä-返金-😀","notify","send"]'.encode()
    assert effect_key("mail", "send", "Lauf-ä-返金-😀", "notify") == "mail:" + hashlib.sha256(material).hexdigest()


def test_key_is_stable_across_calls() -> None:
    keys = {key_of() for _ in range(5)}
    assert len(keys) == 1


@pytest.mark.parametrize("field", ["namespace", "run_id", "step", "operation", "target"])
def test_key_differs_when_any_identifier_differs(field: str) -> None:
    changed = {
        "target": "mail",
        "operation": "refund.cancel",
        "run_id": "run-2",
        "step": "refund-order-124",
        "namespace": "shop-eu",
    }[field]
    assert key_of(**{field: changed}) != key_of()
    # and the difference is in the digest, except for the target prefix
    if field != "target":
        assert key_of(**{field: changed}).split(":")[1] != key_of().split(":")[1]


def test_key_fields_cannot_be_confused_by_shifting_separators() -> None:
    """The JSON array encoding keeps the fields apart: moving text between run_id and step, even text
    that looks like the encoding itself, changes the key."""
    assert key_of(run_id="a", step="b,c") != key_of(run_id="a,b", step="c")
    assert key_of(run_id='r","x', step="y") != key_of(run_id="r", step='x","y')
    assert key_of(run_id="r\\", step="s") != key_of(run_id="r", step="\\s")


def test_key_shape_target_prefix_and_64_hex_digest() -> None:
    for (target, *_), expected in KEY_VECTORS:
        m = KEY_SHAPE.match(expected)
        assert m is not None and m["target"] == target
    key = key_of(target="tickets")
    m = KEY_SHAPE.match(key)
    assert m is not None, key
    assert key.startswith("tickets:")
    assert m["target"] == "tickets"
    assert len(m["digest"]) == 64
    assert check_key(key) == key
    assert len(key) <= MAX_KEY_LENGTH


@settings(max_examples=200, deadline=None)
@given(
    a=st.tuples(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8)),
    b=st.tuples(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8)),
)
def test_key_is_injective_in_namespace_run_and_step(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    ka = effect_key("t", "op", a[1], a[2], namespace=a[0])
    kb = effect_key("t", "op", b[1], b[2], namespace=b[0])
    assert (ka == kb) == (a == b)
    assert KEY_SHAPE.match(ka)


@pytest.mark.parametrize(
    "over",
    [
        {"run_id": ""},
        {"step": ""},
        {"namespace": ""},
        {"target": "bad target"},
        {"target": ""},
        {"operation": "refund/create"},
        {"target": "-payments"},
    ],
)
def test_effect_key_rejects_bad_identifiers(over: dict[str, str]) -> None:
    with pytest.raises(InvalidEffect):
        key_of(**over)


def test_effect_key_rejects_non_string_run_id() -> None:
    with pytest.raises(InvalidEffect):
        effect_key("payments", "refund.create", 123, "s")  # type: ignore[arg-type]


# --- canonical_json and digest --------------------------------------------------------------------


def test_canonical_json_sorts_keys_and_has_no_whitespace() -> None:
    value = {"b": 1, "a": [1, 2.5, {"d": None, "c": "é 返金"}], "A": True}
    out = canonical_json(value)
    assert out == '{"A":true,"a":[1,2.5,{"c":"é 返金","d":null}],"b":1}'
    assert not re.search(r"\s", out.replace("é 返金", ""))


def test_canonical_json_is_independent_of_insertion_order() -> None:
    a = {"order": "123", "amount": 4800, "currency": "CNY", "meta": {"y": 1, "x": 2}}
    b = {"meta": {"x": 2, "y": 1}, "currency": "CNY", "amount": 4800, "order": "123"}
    assert canonical_json(a) == canonical_json(b)
    assert digest(canonical_json(a)) == digest(canonical_json(b))


def test_digest_is_sha256_hex_of_utf8() -> None:
    c = canonical_json({"note": "Rückerstattung"})
    assert digest(c) == hashlib.sha256(c.encode("utf-8")).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", digest(c))
    assert digest(canonical_json({"amount": 1})) != digest(canonical_json({"amount": 2}))


@pytest.mark.parametrize(
    "bad",
    [
        math.nan,
        {"amount": math.nan},
        [math.inf],
        {"x": -math.inf},
        object(),
        {"x": {1, 2}},
        b"bytes",
        {"when": __import__("datetime").date(2024, 1, 1)},
        {1: "a", "b": 2},
    ],
    ids=["nan", "nested-nan", "inf", "-inf", "object", "set", "bytes", "date", "mixed-key-types"],
)
def test_canonical_json_rejects_nan_and_non_serialisable(bad: object) -> None:
    with pytest.raises(InvalidEffect):
        canonical_json(bad)


def test_canonical_json_rejects_circular_structures() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(InvalidEffect):
        canonical_json(loop)


# --- check_name / check_key -----------------------------------------------------------------------


@pytest.mark.parametrize("good", ["payments", "refund.create", "a", "A_b-c.d", "9lives", "x" * 64])
def test_check_name_accepts_good_names(good: str) -> None:
    assert check_name("target", good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "pay ments",
        "payments ",
        "refund/create",
        "x" * 65,
        "-payments",
        "_payments",
        ".payments",
        "pay:ments",
        "zahlungsüberweisung",
        None,
        42,
    ],
    ids=[
        "empty",
        "space",
        "inner-space",
        "trailing-space",
        "slash",
        "65-chars",
        "leading-dash",
        "leading-underscore",
        "leading-dot",
        "colon",
        "non-ascii",
        "none",
        "int",
    ],
)
def test_check_name_rejects_bad_names(bad: object) -> None:
    with pytest.raises(InvalidEffect):
        check_name("target", bad)


@pytest.mark.parametrize("bad", ["payments\n", "x" * 64 + "\n"], ids=["trailing-newline", "64-chars+newline"])
def test_check_name_rejects_a_trailing_newline(bad: str) -> None:
    """BUG (effect_ledger/core/keys.py:19,24): ``_NAME.match`` with a ``$`` anchor accepts a trailing newline,
    so "payments\\n" passes as a target and ends up inside the key. Use ``fullmatch`` (or ``\\Z``)."""
    with pytest.raises(InvalidEffect):
        check_name("target", bad)


def test_effect_key_rejects_a_target_with_a_trailing_newline() -> None:
    """BUG (same as above): the newline would otherwise go into the idempotency key itself."""
    with pytest.raises(InvalidEffect):
        effect_key("payments\n", "refund.create", "run-1", "refund-order-123")


@pytest.mark.parametrize("good", ["k", "payments:" + "a" * 64, "x" * MAX_KEY_LENGTH, "order-123_!~"])
def test_check_key_accepts_printable_ascii_up_to_255(good: str) -> None:
    assert check_key(good) == good


@pytest.mark.parametrize(
    "bad",
    ["", "x" * (MAX_KEY_LENGTH + 1), "has space", " lead", "tab\there", "line\nbreak", "schlüssel", None, 7],
    ids=["empty", "256-chars", "space", "leading-space", "tab", "inner-newline", "non-ascii", "none", "int"],
)
def test_check_key_rejects_bad_keys(bad: object) -> None:
    with pytest.raises(InvalidEffect):
        check_key(bad)


def test_check_key_rejects_a_trailing_newline() -> None:
    """BUG (effect_ledger/core/keys.py:20,36): ``_KEY.match`` with ``$`` accepts "abc\\n", a key with a newline,
    which is unsafe in an HTTP header (the reason the rule exists). Use ``fullmatch`` (or ``\\Z``)."""
    with pytest.raises(InvalidEffect):
        check_key("abc\n")
