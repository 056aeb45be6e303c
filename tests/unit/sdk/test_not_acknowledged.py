"""The reason an attempt is not called when Kafka did not acknowledge its intent in time names the
wait that attempt had: the whole ``sync_timeout``, or what earlier attempts of the same ``execute``
(refused for a cause that passes, and tried again) left of it."""

from __future__ import annotations

import pytest

from effect_ledger.sdk._executor import not_acknowledged


@pytest.mark.parametrize(
    ("waited", "sync_timeout", "reason"),
    [
        (30.0, 30.0, "intent not acknowledged by Kafka within 30 s; destination not called"),
        (29.4, 30.0, "intent not acknowledged by Kafka within 30 s; destination not called"),  # the plan's own ms
        (
            2.25,
            30.0,
            "intent not acknowledged by Kafka in the 2.2 s left of the 30 s sync_timeout (earlier attempts of "
            "this call were refused and took the rest); destination not called",
        ),
        (
            0.0,
            5.0,
            "intent not acknowledged by Kafka in the 0.0 s left of the 5 s sync_timeout (earlier attempts of "
            "this call were refused and took the rest); destination not called",
        ),
    ],
)
def test_the_reason_names_the_wait_the_attempt_had(waited: float, sync_timeout: float, reason: str) -> None:
    assert not_acknowledged(waited, sync_timeout) == reason
