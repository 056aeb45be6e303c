"""The evidence rule (effect_ledger.targets.evidence), decided purely: which answers may count."""

from __future__ import annotations

import pytest

from effect_ledger.core.reconcile import Absent, Answer, Found, Unknown
from effect_ledger.targets.evidence import Provenance, admit

OWN = Provenance("https://gw/refunds/by-key/k", "https://gw/refunds/by-key/k")
ANSWERS: list[Answer] = [Found("re_1", {"id": "re_1"}), Absent("HTTP 404")]


@pytest.mark.parametrize("answer", ANSWERS)
def test_the_named_destinations_own_answer_in_shape_passes_unchanged(answer: Answer) -> None:
    assert admit(answer, OWN) == answer


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize(
    ("provenance", "why"),
    [
        (Provenance("https://gw/a", "https://gw/b"), "not from https://gw/a"),
        (Provenance("https://gw/a", "https://gw/a", redirected=True), "after a redirect"),
        (Provenance("https://gw/a", "https://gw/a", shape_error="HTML, not JSON"), "HTML, not JSON"),
    ],
)
def test_another_page_a_redirect_or_a_wrong_shape_is_never_absent_nor_a_receipt(
    answer: Answer, provenance: Provenance, why: str
) -> None:
    got = admit(answer, provenance)
    assert isinstance(got, Unknown) and why in got.reason
    assert ("re_1" in got.reason) == isinstance(answer, Found)  # says what it would have meant


def test_a_destination_that_keeps_no_record_can_confirm_but_never_prove_absence() -> None:
    blind = Provenance("imap://mail/Sent", "imap://mail/Sent", sees_absence=False)
    assert admit(Found("<m@x>"), blind) == Found("<m@x>")
    got = admit(Absent("no match"), blind)
    assert isinstance(got, Unknown) and "nobody can tell" in got.reason


def test_unknown_stays_unknown() -> None:
    assert admit(Unknown("timeout"), Provenance("a", "b", redirected=True)) == Unknown("timeout")
