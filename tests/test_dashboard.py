"""The dashboard in a real headless Chromium against a real daemon (``serve --http``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import browserkit
from tests.support.daemonkit import HTTP, serving

pytestmark = pytest.mark.skipif(browserkit.missing() is not None, reason=browserkit.missing() or "")


def test_dashboard_shows_a_running_turn_follows_its_events_and_cancels_it(tmp_path: Path) -> None:
    """The page shows a running turn without reloading; its turn page streams the events as they
    come; the cancel button asks for confirmation, and once accepted the result shown is
    `aborted` or `killed`; while the tab is hidden it sends no request. Screenshots of both pages
    are saved as test artifacts."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    with (
        serving(
            "--workers", "2", "--spares", "0", "--grace", "1", "--kill-after", "0.5", "--drain", "0", *HTTP
        ) as d,
        browserkit.chromium(tmp_path / "chromedriver.log") as browser,
    ):
        wait = WebDriverWait(browser, 60)
        browser.get(d.http_url)
        wait.until(ec.text_to_be_present_in_element((By.ID, "daemon"), f"pid {d.pid}"))
        with httpx.Client(base_url=d.http_url, timeout=60) as http:
            r = http.post(
                "/v1/turns",
                json={"agent": "tests.agents.http:ticker", "input": {"every": 0.1}, "session": "demo"},
            )
            assert r.status_code == 201, r.text
            turn_id = r.json()["turn_id"]
        # The running turn appears on the live page (no reload). The table is redrawn every second,
        # so each look-up finds the row afresh (a row found earlier may be gone: stale).
        stale = (StaleElementReferenceException, NoSuchElementException)
        wait = WebDriverWait(browser, 60, ignored_exceptions=stale)
        row_css = f'#running tr[data-turn="{turn_id}"]'
        text = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, row_css).text)
        assert "tests.agents.http:ticker" in text and "demo" in text
        browser.save_screenshot(str(tmp_path / "dashboard-overview.png"))

        def open_turn(b: Any) -> bool:
            b.find_element(By.CSS_SELECTOR, row_css).find_element(By.LINK_TEXT, turn_id).click()
            return True

        wait.until(open_turn)
        # Its page: the events stream in.
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#turn-events .event")) >= 5)
        first = browser.find_element(By.CSS_SELECTOR, "#turn-events .event").text
        assert first.startswith("0") and '"tick":0' in first
        assert '"every": 0.1' in browser.find_element(By.ID, "turn-input").text
        # Cancel, with the confirmation accepted.
        wait.until(ec.element_to_be_clickable((By.ID, "turn-cancel"))).click()
        dialog = wait.until(ec.alert_is_present())
        assert "Cancel turn" in dialog.text
        dialog.accept()
        result = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#turn-result[data-outcome]")))
        assert result.get_attribute("data-outcome") in ("aborted", "killed")
        assert '"kind": "user"' in result.text
        shot = tmp_path / "dashboard-turn.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        print(f"screenshots: {tmp_path}")
        # Back on the overview, the ended turn is among the recent outcomes.
        browser.get(d.http_url)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'#recent tr[data-turn="{turn_id}"]')))
        # Hidden, the page sends nothing: across a 2.5 s turn (the clock here), the daemon counts only
        # this test's own three requests; shown again, the page polls again.
        set_hidden = (
            "Object.defineProperty(document, 'hidden', {configurable: true, get: () => arguments[0]});"
            "document.dispatchEvent(new Event('visibilitychange'));"
        )
        browser.execute_script(set_hidden, True)
        with httpx.Client(base_url=d.http_url, timeout=60) as http:
            before = http.get("/v1/status").json()["http"]["requests"]
            clock = http.post("/v1/turns", json={"agent": "examples.agents:slow", "input": {"seconds": 2.5}})
            assert http.get(f"/v1/turns/{clock.json()['turn_id']}", params={"wait": 60}).status_code == 200
            after = http.get("/v1/status").json()["http"]["requests"]
            assert after - before == 3, (before, after)
            browser.execute_script(set_hidden, False)
            WebDriverWait(browser, 60).until(
                lambda b: http.get("/v1/status").json()["http"]["requests"] > after + 3
            )
