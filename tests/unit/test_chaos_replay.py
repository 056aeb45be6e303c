"""The chaos run's replay line runs the same schedule: parsed again, it gives the same seed, fault
kinds and shaping options as the run that printed it."""

from __future__ import annotations

import shlex

import pytest

from tests.chaos.__main__ import _SHAPING, _args, replay_command


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--short"],
        ["--minutes", "4", "--faults", "pause-broker,pause-coordinator"],
        ["--short", "--rate", "20", "--hold", "8", "--gap", "3.5", "--timeout", "1.5", "--partitions", "3"],
    ],
)
def test_the_replay_line_gives_the_same_run(argv: list[str]) -> None:
    a = _args(argv)
    line = replay_command(a, 1234)
    assert line.startswith("python -m tests.chaos ")
    again = _args(shlex.split(line)[3:])
    assert again.seed == 1234
    assert (again.short, again.minutes, again.kinds) == (a.short, a.minutes, a.kinds)
    for name in _SHAPING:
        assert getattr(again, name) == getattr(a, name), name


def test_defaults_are_left_out() -> None:
    assert replay_command(_args([]), 7) == "python -m tests.chaos --minutes 30 --seed 7"
