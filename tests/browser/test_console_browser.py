"""The console in a real browser: Debian's chromium, headless, driven by selenium through
/usr/bin/chromedriver (``scripts/install-browser.sh`` installs both; ``make test`` runs it first).

Over a real ledger file with known contents (``tests/console_ledger.py``): load the effects page,
filter a window, open a trace, resolve an escalation without credentials (refused, nothing written)
and with them (recorded, the operator shown). Each page is saved as a PNG to ``build/screenshots/``,
or to ``$EFFECTS_SCREENSHOTS_DIR`` (``EFFECTS_SCREENSHOTS_DIR=docs/screenshots make test-browser``
refreshes the docs' pictures); a test run never rewrites tracked files. Under CI (``CI`` set) a
missing browser is a failure, not a skip: ``make test`` installs it first."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from effect_ledger.console.auth import Credentials
from tests.console_ledger import ConsoleLedger, console_ledger
from tests.console_server import serve
from tests.ops_expected import now_ms

CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("EFFECTS_SCREENSHOTS_DIR") or ROOT / "build" / "screenshots")
TOKEN = "browser-test-token"

pytestmark = pytest.mark.skipif(
    (not CHROMEDRIVER.exists() or shutil.which("chromium") is None) and not os.environ.get("CI"),
    reason="needs chromium and chromium-driver: run scripts/install-browser.sh (make test does)",
)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> ConsoleLedger:
    return console_ledger(tmp_path_factory.mktemp("browser") / "console.db", now_ms())


@pytest.fixture(scope="module")
def url(ledger: ConsoleLedger) -> Iterator[str]:
    with serve(str(ledger.path), Credentials(TOKEN, {"alice": "wonderland"})) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,800",
        "--hide-scrollbars",
        "--no-first-run",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    # The page itself 1280x800, whatever the headless window's frame takes.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    )
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: object, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SHOTS / f"{name}.png"))  # type: ignore[attr-defined]


def text(driver: object, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)  # type: ignore[attr-defined]


def click_to_load(driver: object, element: object) -> None:
    """Click something that loads a page, and wait (a deadline, polled) until the old page is gone:
    a form submit returns before the new page is there."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")  # type: ignore[attr-defined]
    element.click()  # type: ignore[attr-defined]

    def gone(_: object) -> bool:
        # While the page is being replaced, chromedriver may answer for the old node with a stale
        # reference or with a generic "node does not belong to the document": both mean it is gone.
        try:
            old.is_enabled()  # type: ignore[attr-defined]
        except WebDriverException:
            return True
        return False

    WebDriverWait(driver, 30).until(gone)
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def events_and_state(ledger: ConsoleLedger, key: str) -> tuple[int, str]:
    import sqlite3

    with sqlite3.connect(f"file:{ledger.path}?mode=ro", uri=True) as conn:
        n = conn.execute("SELECT count(*) FROM events WHERE effect_id = ?", (key,)).fetchone()[0]
        st = conn.execute("SELECT state FROM effects WHERE effect_id = ?", (key,)).fetchone()[0]
    return n, st


def test_load_and_filter_a_window(browser: object, url: str, ledger: ConsoleLedger) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    d.get(url + "/?from=-1h")  # type: ignore[attr-defined]
    counts = text(d, "#counts-state")
    assert "CONFIRMED 995" in counts and "PENDING 5" in counts and "ESCALATED 2" in counts
    assert "1,002 matching" in text(d, "#shown")
    assert d.find_elements(By.CSS_SELECTOR, "#effects tr.stuck")  # type: ignore[attr-defined]
    shot(d, "effects")
    # Filter: the stuck ones only, in the incident's window (30 to 20 minutes ago).
    f = d.find_element(By.ID, "f-from")  # type: ignore[attr-defined]
    f.clear()
    f.send_keys("-35m")
    t = d.find_element(By.ID, "f-to")  # type: ignore[attr-defined]
    t.clear()
    t.send_keys("-18m")
    d.find_element(By.CSS_SELECTOR, 'input[name="state"][value="PENDING"]').click()  # type: ignore[attr-defined]
    click_to_load(d, d.find_element(By.ID, "apply"))  # type: ignore[attr-defined]
    assert "5 of 5 matching" in text(d, "#shown")
    keys = {a.text for a in d.find_elements(By.CSS_SELECTOR, "#effects a.key")}  # type: ignore[attr-defined]
    assert keys == set(ledger.incident.stuck)
    assert "ESCALATED" not in text(d, "#counts-state")  # begun 15 minutes ago: outside the window
    shot(d, "effects-filtered")


def test_a_bad_window_is_a_message_on_the_page(browser: object, url: str) -> None:
    d = browser
    d.get(url + "/?from=-1h&to=-2h")  # type: ignore[attr-defined]
    assert "empty window" in text(d, "#error")
    shot(d, "bad-window")


def test_open_a_trace(browser: object, url: str, ledger: ConsoleLedger) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    d.get(url + "/audit?from=-1h")  # type: ignore[attr-defined]
    assert "FAIL" in text(d, "#checks")
    assert d.find_elements(By.CSS_SELECTOR, "svg.chart rect")  # type: ignore[attr-defined]
    shot(d, "audit")
    click_to_load(d, d.find_element(By.CSS_SELECTOR, "#duplicates a.key"))  # type: ignore[attr-defined]
    assert "sent-but-unrecorded window: 2 ms, 2 ms" in text(d, "#windows")
    assert len(d.find_elements(By.CSS_SELECTOR, "svg.timeline rect.unrecorded")) == 2  # type: ignore[attr-defined]
    assert len(d.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")) == 6  # type: ignore[attr-defined]
    shot(d, "trace")


def _resolve(d: object, key: str, decision: str, user: str, secret: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    form = d.find_element(By.CSS_SELECTOR, f'.escalation[data-key="{key}"] form.resolve')  # type: ignore[attr-defined]
    Select(form.find_element(By.NAME, "decision")).select_by_value(decision)
    form.find_element(By.NAME, "reason").send_keys("refunded by hand after a call with the gateway")
    form.find_element(By.NAME, "user").send_keys(user)
    form.find_element(By.NAME, "secret").send_keys(secret)
    click_to_load(d, form.find_element(By.CSS_SELECTOR, "button"))


def test_resolve_an_escalation_without_and_with_credentials(browser: object, url: str, ledger: ConsoleLedger) -> None:
    d = browser
    key = ledger.escalated
    d.get(url + "/stuck")  # type: ignore[attr-defined]
    assert "escalation queue: 2" in text(d, "#queue")
    assert "ESCALATE (no answer after 5 tries)" in text(d, f'.escalation[data-key="{key}"]')
    shot(d, "stuck-and-escalations")
    before = events_and_state(ledger, key)

    _resolve(d, key, "ABANDONED", "alice", "not-her-password")
    assert "wrong or missing credentials" in text(d, "#error") and "nothing was written" in text(d, "#decided")
    assert events_and_state(ledger, key) == before
    shot(d, "resolve-refused")

    d.get(url + "/stuck")  # type: ignore[attr-defined]
    _resolve(d, ledger.in_flight, "ABSENT", "alice", "wonderland")
    assert "may still land at the destination" in text(d, "#error")
    assert events_and_state(ledger, ledger.in_flight)[1] == "ESCALATED"

    d.get(url + "/stuck")  # type: ignore[attr-defined]
    _resolve(d, key, "ABANDONED", "alice", "wonderland")
    assert "decision ABANDONED recorded by alice; state ABANDONED" in text(d, "#decided")
    assert events_and_state(ledger, key) == (before[0] + 1, "ABANDONED")
    shot(d, "resolve-recorded")

    from selenium.webdriver.common.by import By

    click_to_load(d, d.find_element(By.CSS_SELECTOR, "#decided a.key"))  # type: ignore[attr-defined]
    last = d.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")[-1].text  # type: ignore[attr-defined]
    assert "decision ABANDONED: refunded by hand" in last and "person:alice" in last
    shot(d, "trace-decided")
