"""Times and durations from a person (the command line, the console's query string, targets.toml):
every text that is not one is a ``TimeSpecError`` with a short message, never a plain ValueError
that its callers (which catch ``TimeSpecError``) let through as a traceback or a 500."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from effect_ledger.core.timeparse import TimeSpecError, duration_ms, time_ms

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z

NOT_TIMES = {
    "superscript digits": "²" * 12,  # str.isdigit() is true, int() refuses them
    "Arabic-Indic digits": "١٢٣٤٥٦٧٨٩٠١٢",  # int() reads these: still not what a person typed as epoch ms
    "5000 digits": "1" * 5000,  # over int()'s 4300-digit limit
    "5000 digits ago": "-" + "1" * 5000,
    "superscript duration ago": "-²s",
    "a lone surrogate": "\ud800",
}
NOT_DURATIONS = {
    "superscript digits": "²s",
    "Arabic-Indic digits": "١٢m",
    "5000 digits": "1" * 5000,
}


@pytest.mark.parametrize("case", sorted(NOT_TIMES))
def test_every_text_that_is_not_a_time_is_a_time_spec_error(case: str) -> None:
    with pytest.raises(TimeSpecError, match="^not a time: ") as e:
        time_ms(NOT_TIMES[case], NOW)
    assert len(str(e.value)) < 200  # the message quotes a bounded head, not the whole text


@pytest.mark.parametrize("case", sorted(NOT_DURATIONS))
def test_every_text_that_is_not_a_duration_is_a_time_spec_error(case: str) -> None:
    with pytest.raises(TimeSpecError, match="^not a duration: ") as e:
        duration_ms(NOT_DURATIONS[case])
    assert len(str(e.value)) < 200


def test_the_valid_forms_still_read() -> None:
    assert time_ms("now", NOW) == NOW
    assert time_ms("-1h", NOW) == NOW - 3_600_000
    assert time_ms(str(NOW), NOW) == NOW
    assert time_ms(" 2026-01-01T05:30:00.000000+05:30 ", NOW) == NOW
    assert duration_ms(" 10 m ") == 600_000 and duration_ms("1.5s") == 1500


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["audit", "--from", "²" * 12], "not a time: '" + "²" * 12 + "'"),
        (["audit", "--from", "-1h", "--to", "1" * 5000], "5000 characters, at most 64"),
        (["audit", "--from", "-1h", "--stuck-after", "١٢m"], "not a duration: '١٢m'"),
    ],
)
def test_the_command_line_says_so_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    r = CliRunner().invoke(main, [*args, "--db", str(tmp_path / "none.db")])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("effects: ") and message in lines[0], r.output
