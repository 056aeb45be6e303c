"""The offsets a lookup names (``streams.lookup.FoldedThrough``) and how the processor reads them
back from a request's query: a claim answer covers the agent's own intent, or the request is refused."""

from __future__ import annotations

from typing import Any

import pytest

from effect_ledger.core.effect import apply, claim_verdict
from effect_ledger.core.model import Intent
from effect_ledger.sdk.kafka.claims import owns
from effect_ledger.sdk.kafka.lookup import FoldedThrough, _lagging, folded_through_asked


def test_the_query_a_lookup_sends_reads_back_as_what_it_asked() -> None:
    asked = FoldedThrough(2, 41, 7)
    assert folded_through_asked(asked.params(), 2) == asked
    assert folded_through_asked(dict(p.split("=") for p in asked.query()[1:].split("&")), 2) == asked
    assert folded_through_asked({"partition": "2", "offset": "41"}, 2) == FoldedThrough(2, 41, -1)


def test_no_offset_means_wait_for_the_high_watermarks() -> None:
    assert folded_through_asked({}, 0) is None
    assert folded_through_asked({"owner-only": "1"}, 0) is None


def test_offsets_that_do_not_cover_the_key_are_refused() -> None:
    assert "partition 1, not 2" in str(folded_through_asked({"partition": "2", "offset": "5"}, 1))
    assert "integers" in str(folded_through_asked({"partition": "1", "offset": "x"}, 1))
    assert "integers" in str(folded_through_asked({"offset": "5"}, 1))  # no partition named
    assert "between" in str(folded_through_asked({"partition": "1", "offset": "-2"}, 1))
    assert "between" in str(folded_through_asked({"partition": "1", "offset": str(2**63)}, 1))


def test_owns_reads_the_recorded_verdict() -> None:
    def intent(event_id: str, worker: str) -> Intent:
        return Intent(event_id, "k", 1, 1, "t", "op", "ns", "r", "s", "{}", "d" * 64, 10, worker)

    x, y = intent("x", "a"), intent("y", "b")
    e, _ = apply(None, x)
    assert owns(e, x) is None  # nobody arbitrated yet
    v = claim_verdict(e, x)
    assert v is not None
    e, _ = apply(e, v)
    e, _ = apply(e, y)
    assert owns(e, x) is True and owns(e, y) is False


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {"lagging": True, "partition": 2, "processed": 41, "high_watermark": 50},
            "lags on partition 2: consumed through offset 41, high watermark 50",
        ),
        ({"lagging": True, "reason": "the processor is starting"}, "key's partition yet: the processor is starting"),
        (
            {"lagging": True, "partition": 0, "reason": "no worker owns the partition right now"},
            "partition 0 yet: no worker owns the partition right now",
        ),
        ({"lagging": True}, "yet: no reason given"),
    ],
)
def test_a_lagging_answer_says_why_in_the_processors_words(body: dict[str, Any], says: str) -> None:
    text = _lagging(body, "http://w:6066")
    assert says in text and "None" not in text, text
