"""``effects assess --html`` in a real browser (Debian's chromium, headless, through selenium, as the
console's browser test): the generated month of calls (``tests/assess_gen.py``, written by Langfuse's
own observation model) assessed to a self-contained page, loaded from the file, checked and saved as
``assess-report.png`` (``build/screenshots/``, or ``$EFFECTS_SCREENSHOTS_DIR``:
``EFFECTS_SCREENSHOTS_DIR=docs/screenshots`` refreshes the picture in docs/guides/assess.md)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from tests.assess_gen import WRITES, scenario
from tests.unit.ops.test_assess_formats import langfuse_log

CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("EFFECTS_SCREENSHOTS_DIR") or ROOT / "build" / "screenshots")

pytestmark = pytest.mark.skipif(
    (not CHROMEDRIVER.exists() or shutil.which("chromium") is None) and not os.environ.get("CI"),
    reason="needs chromium and chromium-driver: run scripts/install-browser.sh (make test does)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,800", "--hide-scrollbars", "--no-first-run"):  # fmt: skip
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_html_report_in_a_browser(browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    sc = scenario(pending=True)
    log, page = tmp_path / "observations.jsonl", tmp_path / "report.html"
    langfuse_log(sc, log)
    r = CliRunner().invoke(main, ["assess", str(log), "--writes", ",".join(WRITES), "--html", str(page)])
    assert r.exit_code == 0, r.output
    d: object = browser
    d.get(page.as_uri())  # type: ignore[attr-defined]
    find = d.find_element  # type: ignore[attr-defined]
    finds = d.find_elements  # type: ignore[attr-defined]
    assert find(By.ID, "verdict").text.startswith(("fix it:", "not yet:"))
    rows = finds(By.CSS_SELECTOR, "#rows tr")[1:]
    assert len(rows) == 8
    cells = [row.find_elements(By.TAG_NAME, "td") for row in rows]
    # schema changes first; every measured cell shows num/den; the unmeasurable one says what it needs
    needs = [c[5].text.split(":")[0] for c in cells]
    assert needs == ["a schema change"] * 3 + ["code or configuration"] * 5
    assert cells[0][2].text.startswith("178/247") and cells[0][4].text == "fix first"
    assert cells[1][2].text.startswith("not measurable from this log: needs an intent record")
    assert cells[7][2].text.startswith("5/230")
    assert len(finds(By.TAG_NAME, "svg")) == 2 and len(finds(By.CSS_SELECTOR, "svg rect")) > 4
    tools = [t.text for t in finds(By.CSS_SELECTOR, "#tools td:first-child")]
    assert tools == ["refund", "send_email", "create_ticket", "lookup"]
    text = find(By.TAG_NAME, "body").text
    for value in ("example.com", "refund:A-", "order B-", "tkt-"):
        assert value not in text  # the examples name lines and tools, never values
    height = d.execute_script("return document.body.scrollHeight")  # type: ignore[attr-defined]
    d.set_window_size(1280, min(int(height) + 40, 4000))  # type: ignore[attr-defined]
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert d.save_screenshot(str(SHOTS / "assess-report.png"))  # type: ignore[attr-defined]
