"""The README's first screen works as copied: the "Your first effect" section's shell and Python
blocks, run in order in an empty folder with the installed package (its ``effects`` and ``python``
first on PATH), reach a recorded effect. A Python block is saved under the name the sentence before
it gives ("Save this as `refund.py`"); shell lines that set up an environment (activating a
virtualenv, ``pip install``) are left out, since the package under test is installed already.

Also: the README stays a front door (its length), and every relative link in it names a file that
exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECTION = "## Your first effect, in five minutes"
SETUP = re.compile(r"^\s*(\. |source |pip |python3 -m venv )")


def first_effect_script() -> tuple[str, list[str]]:
    """The section as one shell script (Python blocks become files), and the commands it runs."""
    section = README.split(SECTION, 1)[1].split("\n## ", 1)[0]
    script, commands = ["set -euo pipefail"], []
    prev_end = 0
    for m in re.finditer(r"^```(?P<lang>\w+)\n(?P<body>.*?)\n```$", section, re.S | re.M):
        lang, body = m["lang"], m["body"]
        before, prev_end = section[prev_end : m.start()], m.end()  # the prose since the last block
        if lang == "python":
            name = re.search(r"Save this as `([^`]+)`", before)
            assert name, f"a Python block without a file name to save it as: {before!r}"
            script.append(f"cat > {name[1]} <<'README_EOF'\n{body}\nREADME_EOF")
        elif lang == "bash":
            for line in body.splitlines():
                if line.strip() and not SETUP.match(line):
                    script.append(f'echo "\\$ {line.split("#")[0].strip()}"')
                    script.append(line)
                    commands.append(line.split("#")[0].strip())
        else:
            raise AssertionError(f"a {lang} block in the first-effect section: say how the test runs it")
    return "\n".join(script) + "\n", commands


def test_the_first_effect_section_runs_as_copied(tmp_path: Path) -> None:
    script, commands = first_effect_script()
    assert any(c == "effects init" for c in commands)
    assert sum(c.startswith("python refund.py") for c in commands) == 2
    # The installed package's commands first on PATH, nothing of this checkout's on PYTHONPATH.
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EFFECTS_TARGETS", "EFFECTS_CONSOLE_URL")}
    env.update(PATH=bin_dir + os.pathsep + env.get("PATH", ""), COLUMNS="200")
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    out = r.stdout
    work = tmp_path / "first-effect"
    assert (work / "targets.toml").is_file() and (work / "effects.db").is_file()
    # What the README's comments say each command prints.
    assert out.count("gateway: refund 4800 for order 1001") == 1  # one refund, two runs
    assert "re_1001 (called the gateway)" in out
    assert "re_1001 (recorded before: not called again)" in out
    key = re.search(r"effects trace (payments:[0-9a-f]{64})", script)
    assert key and f"effect {key[1]}" in out  # the key in the README is the one the example records
    assert "state: CONFIRMED" in out
    assert "FAIL" not in out


def test_the_readme_is_a_front_door() -> None:
    lines = README.splitlines()
    assert len(lines) <= 300, len(lines)
    prerequisites = next(i for i, ln in enumerate(lines) if ln.startswith("## Prerequisites"))
    assert prerequisites < 30  # on the first screen
    for needed in ("make demo", "make test", "effects init", "make docs"):
        assert needed in README, needed


def test_every_relative_link_of_the_readme_exists() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert len(relative) >= 20  # not vacuous
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, missing
