"""The console in a real browser: Debian's chromium, headless, driven by selenium through
/usr/bin/chromedriver (``scripts/install-browser.sh`` installs both; ``make test`` runs it first).

Over a real ledger file with known contents (``tests/console_ledger.py``, its targets declaring
``order_id`` searchable): load the effects page, filter a window, open an effect from the audit; an
on-call finds the refund of order 1001 with one search in the header, reads its page (the request
with the redacted field marked, the reconciler's answers, its run) and records a decision on it
behind the confirmation step, refused without the right credentials (nothing written) and recorded
with them (the operator shown), then goes back to the queue; an ABSENT decision on an attempt that
may still land is refused, with JavaScript off. Every page at 1,280 px wide, none scrolling sideways.
Each page is saved as a PNG to ``build/screenshots/``, or to ``$EFFECTS_SCREENSHOTS_DIR``
(``EFFECTS_SCREENSHOTS_DIR=docs/screenshots make test-browser`` refreshes the pictures of
``docs/guides/console.md``); a test run never rewrites tracked files. Under CI (``CI`` set) a
missing browser is a failure, not a skip: ``make test`` installs it first."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from effect_ledger.console.auth import Credentials
from effect_ledger.console.source import Source
from effect_ledger.targets.load import parse_targets
from tests.console_ledger import TARGETS, ConsoleLedger, console_ledger
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
    source = Source(db=str(ledger.path), targets=parse_targets(TARGETS))
    with serve(source, Credentials(TOKEN, {"alice": "wonderland"})) as base:
        yield base


def _driver(*, javascript: bool = True) -> object:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    if not javascript:
        opts.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
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
    return driver


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    driver = _driver()
    try:
        yield driver
    finally:
        driver.quit()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def no_js_browser() -> Iterator[object]:
    driver = _driver(javascript=False)
    try:
        yield driver
    finally:
        driver.quit()  # type: ignore[attr-defined]


def shot(driver: object, name: str) -> None:
    """Save the page as a PNG, and check it fits 1,280 px: nothing scrolls sideways."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    width = driver.execute_script("return document.documentElement.scrollWidth")  # type: ignore[attr-defined]
    assert width <= 1280, f"{name}: the page is {width} px wide"
    # The whole page, up to a bound, at 1,280 px: the view grows to the page's height for the picture.
    height = driver.execute_script("return document.documentElement.scrollHeight")  # type: ignore[attr-defined]
    metrics = {"width": 1280, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": min(max(800, height), 2000)})  # type: ignore[attr-defined]
    try:
        assert driver.save_screenshot(str(SHOTS / f"{name}.png"))  # type: ignore[attr-defined]
    finally:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": 800})  # type: ignore[attr-defined]


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
    links = d.find_elements(By.CSS_SELECTOR, "#effects a.key")  # type: ignore[attr-defined]
    # Shortened in the table; the full id in the title (and copied by its button).
    assert {a.get_attribute("title") for a in links} == set(ledger.incident.stuck)
    assert all(len(a.text) < 30 and a.get_attribute("title").startswith(a.text.rstrip("…")) for a in links)
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


def _choose(d: object, decision: str, reason: str, receipt: str = "") -> None:
    """On an effect's page: no choice is made in advance; pick one, say why, review it."""
    from selenium.webdriver.common.by import By

    form = d.find_element(By.CSS_SELECTOR, "form.decide")  # type: ignore[attr-defined]
    radios = form.find_elements(By.CSS_SELECTOR, 'input[type="radio"][name="decision"]')
    assert len(radios) == 4 and not any(r.is_selected() for r in radios)
    form.find_element(By.ID, f"d-{decision}").click()
    if receipt:
        form.find_element(By.ID, "d-receipt").send_keys(receipt)
    form.find_element(By.ID, "d-reason").send_keys(reason)
    click_to_load(d, form.find_element(By.ID, "d-next"))


def _confirm(d: object, user: str, secret: str) -> None:
    from selenium.webdriver.common.by import By

    d.find_element(By.ID, "c-user").send_keys(user)  # type: ignore[attr-defined]
    d.find_element(By.ID, "c-secret").send_keys(secret)  # type: ignore[attr-defined]
    click_to_load(d, d.find_element(By.ID, "confirm"))  # type: ignore[attr-defined]


def test_an_on_call_finds_the_refund_of_an_order_and_decides_on_its_page(
    browser: object, url: str, ledger: ConsoleLedger
) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    key = ledger.escalated
    d.get(url + "/stuck")  # type: ignore[attr-defined]
    assert "escalation queue: 2" in text(d, "#queue")
    assert "ESCALATE (no answer after 5 tries)" in text(d, f'.escalation[data-key="{key}"]')
    shot(d, "stuck-and-escalations")

    # One search, from the header of any page.
    d.find_element(By.ID, "h-q").send_keys("order_id:1001")  # type: ignore[attr-defined]
    click_to_load(d, d.find_element(By.ID, "h-search"))  # type: ignore[attr-defined]
    assert "1 found" in text(d, "#searched")
    (link,) = d.find_elements(By.CSS_SELECTOR, "#effects a.key")  # type: ignore[attr-defined]
    assert link.get_attribute("title") == key
    shot(d, "search-order")

    click_to_load(d, link)
    assert d.current_url.endswith("/effect/" + key.replace(":", "%3A"))  # type: ignore[attr-defined]
    assert text(d, "#effect-id") == key
    assert d.find_elements(By.CSS_SELECTOR, "#effect-id + button.copy")  # type: ignore[attr-defined]
    request = text(d, "#request")
    assert 'order_id searchable "1001"' in request and "email redacted" in request and "4800" in request
    answers = text(d, "#answers")
    assert "UNKNOWN" in answers and "ESCALATE" in answers and "no answer after 5 tries" in answers
    assert text(d, "#receipts") == "no receipt recorded"
    same_run = {a.get_attribute("title") for a in d.find_elements(By.CSS_SELECTOR, "#same-run a.key")}  # type: ignore[attr-defined]
    assert same_run == {ledger.in_flight}
    assert "ABSENT It never happened at the destination. Allows a new call" in text(d, "form.decide")
    shot(d, "effect")

    before = events_and_state(ledger, key)
    _choose(d, "CONFIRMED", "refunded by hand after a call with the gateway", receipt="re_manual_1001")
    assert "CONFIRMED" in text(d, "#confirm-summary") and "re_manual_1001" in text(d, "#confirm-summary")
    assert "no new call is made" in text(d, "#consequence")
    assert events_and_state(ledger, key) == before  # reviewing writes nothing
    shot(d, "decide-confirm")

    _confirm(d, "alice", "not-her-password")
    assert "wrong or missing credentials" in text(d, "#error") and "nothing was written" in text(d, "#decided")
    assert events_and_state(ledger, key) == before
    shot(d, "resolve-refused")

    d.back()  # type: ignore[attr-defined]
    d.find_element(By.ID, "c-user").clear()  # type: ignore[attr-defined]
    _confirm(d, "alice", "wonderland")
    assert "decision CONFIRMED recorded by alice; state CONFIRMED" in text(d, "#decided")
    assert events_and_state(ledger, key) == (before[0] + 1, "CONFIRMED")
    shot(d, "resolve-recorded")

    click_to_load(d, d.find_element(By.ID, "back-to-effect"))  # type: ignore[attr-defined]
    last = d.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")[-1].text  # type: ignore[attr-defined]
    assert "decision CONFIRMED: refunded by hand" in last and "person:alice" in last
    assert "re_manual_1001" in text(d, "#receipts") and "alice" in text(d, "#decisions")
    shot(d, "trace-decided")

    d.back()  # type: ignore[attr-defined]
    click_to_load(d, d.find_element(By.ID, "back-to-queue"))  # type: ignore[attr-defined]
    assert "escalation queue: 1" in text(d, "#queue")


def test_a_decision_without_javascript_and_one_that_could_double_is_refused(
    no_js_browser: object, url: str, ledger: ConsoleLedger
) -> None:
    from selenium.webdriver.common.by import By

    d = no_js_browser
    key = ledger.in_flight
    d.get(url + "/?" + "from=-1h&q=1002")  # type: ignore[attr-defined]
    assert not d.find_elements(By.CSS_SELECTOR, "button.copy")  # type: ignore[attr-defined]  # no script ran
    (link,) = d.find_elements(By.CSS_SELECTOR, "#effects a.key")  # type: ignore[attr-defined]
    click_to_load(d, link)
    before = events_and_state(ledger, key)
    _choose(d, "ABSENT", "the gateway says it has no such refund")
    _confirm(d, "alice", "wonderland")
    assert "may still land at the destination" in text(d, "#error") and "nothing was written" in text(d, "#decided")
    assert events_and_state(ledger, key) == before == (before[0], "ESCALATED")
    shot(d, "resolve-refused-may-still-land")
