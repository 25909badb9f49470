"""The dashboard in a real headless Chromium against a real daemon (``serve --http``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import browserkit
from tests.support.daemonkit import HTTP, serving

pytestmark = pytest.mark.skipif(browserkit.missing() is not None, reason=browserkit.missing() or "")

SLOW = "examples.agents:slow"
ECHO = "examples.agents:echo"


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


ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_dashboard_with_a_thousand_turns_pages_filters_deep_links_and_cancels(tmp_path: Path) -> None:
    """1,000 turns (2 running, 998 queued) and a failed one: a deep link to a queued turn works on
    the first load (its state, the daemon in the header); running and queued are separate lists
    paged by the daemon (25 rows, "1–25 of 998", next page); a session filter narrows the queued
    list; cancel on a queued row ends that turn aborted; the failed turn's error is on its row and
    the warm spare is labelled a spare; times are ISO UTC with the local time as their title; the
    history view pages the journal and filters by outcome; an ended turn's page names its worker
    pid. Screenshots of the overview and the history are saved as test artifacts."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    stale = (StaleElementReferenceException, NoSuchElementException)
    with (
        serving(
            "--workers", "2", "--spares", "1", "--grace", "0.5", "--kill-after", "0.5", "--drain", "0", *HTTP
        ) as d,
        httpx.Client(base_url=d.http_url, timeout=60) as http,
        browserkit.chromium(tmp_path / "chromedriver.log") as browser,
    ):
        wait = WebDriverWait(browser, 60, ignored_exceptions=stale)

        def act(by: str, what: str, do: Callable[[Any], Any]) -> None:
            """Find and act on an element in one try, tried again if the page redrew it meanwhile
            (the lists, pagers and filters are rendered again every second)."""
            wait.until(lambda b: do(b.find_element(by, what)) or True)

        failed = http.post("/v1/turns", json={"agent": "examples.agents:failing"}).json()["turn_id"]
        assert http.get(f"/v1/turns/{failed}", params={"wait": 60}).json()["outcome"] == "failed"
        for i in range(2):
            r = http.post("/v1/turns", json={"agent": SLOW, "input": {"seconds": 600}, "session": f"run-{i}"})
            assert r.status_code == 201, r.text
        queued = []
        for i in range(998):
            r = http.post("/v1/turns", json={"agent": ECHO, "input": {"i": i}, "session": f"batch-{i % 10}"})
            assert r.status_code == 201, r.text
            queued.append(r.json()["turn_id"])

        # A deep link on the first load: the queued turn's page and the header fill at once.
        target = queued[500]
        browser.get(f"{d.http_url}#/turn/{target}")
        wait.until(ec.text_to_be_present_in_element((By.ID, "turn-id"), target))
        wait.until(ec.text_to_be_present_in_element((By.ID, "turn-state"), "queued"))
        wait.until(ec.text_to_be_present_in_element((By.ID, "daemon"), f"pid {d.pid}"))
        assert "batch-0" in browser.find_element(By.ID, "turn-facts").text

        # The overview: separate paged lists counted by the daemon.
        act(By.ID, "nav-overview", lambda e: e.click())
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#queued-pager .range"), "1–25 of 998"))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#running-pager .range"), "1–2 of 2"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "#queued tbody tr[data-turn]")) == 25
        act(By.CSS_SELECTOR, "#queued-pager .next", lambda e: e.click())
        wait.until(
            ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#queued-pager .range"), "26–50 of 998")
        )
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#queued tbody tr[data-turn]")) == 25)
        # The warm spare is a spare, not a worker.
        wait.until(ec.text_to_be_present_in_element((By.ID, "busy"), "2 / 2"))
        wait.until(ec.text_to_be_present_in_element((By.ID, "spares"), "1 / 1"))
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, '#workers tr[data-role="spare"]'))
        # The failed turn's error on its row; times in one format, local time on hover.
        # The rows are rendered again every second: read a row's text and its time cell in one call.
        read_row = (
            'const r = document.querySelector(`#recent tr[data-turn="${arguments[0]}"]`);'
            "if (!r) return null; const c = r.querySelector('td.time');"
            "return [r.textContent, c ? c.textContent : '', c ? (c.getAttribute('title') || '') : ''];"
        )
        text, when, title = wait.until(lambda b: b.execute_script(read_row, failed))
        assert "ValueError: this agent always fails" in text
        assert ISO_UTC.match(when) and "(local)" in title, (when, title)
        browser.save_screenshot(str(tmp_path / "dashboard-overview.png"))

        # A filter: one session's queued turns, back on the first page.
        act(By.ID, "f-session", lambda e: e.send_keys("batch-3"))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#queued-pager .range"), "1–25 of 100"))
        rows = "document.querySelectorAll('#queued tbody tr[data-turn]')"
        sessions = f"return [...{rows}].map(r => r.cells[2].textContent)"
        wait.until(
            lambda b: set(b.execute_script(sessions)) == {"batch-3"}
        )  # read in one call: no stale rows

        # Cancel a queued turn from its row, confirmation accepted: it ends aborted.
        victim = wait.until(
            lambda b: b.find_element(By.CSS_SELECTOR, "#queued tbody tr[data-turn]").get_attribute(
                "data-turn"
            )
        )

        def click_cancel(b: Any) -> bool:
            b.find_element(By.CSS_SELECTOR, f'#queued tr[data-turn="{victim}"] button.cancel-turn').click()
            return True

        wait.until(click_cancel)
        dialog = wait.until(ec.alert_is_present())
        assert victim in dialog.text
        dialog.accept()
        res = http.get(f"/v1/turns/{victim}", params={"wait": 60}).json()
        assert res["outcome"] == "aborted" and res["cause"] == {"kind": "user"}
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#queued-pager .range"), "1–25 of 99"))

        # The history: the journal, paged and filtered by outcome.
        act(By.ID, "nav-history", lambda e: e.click())
        wait.until(ec.text_to_be_present_in_element((By.ID, "history-source"), "1001 turn(s) in the journal"))
        wait.until(
            ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#history-pager .range"), "1–50 of 1001")
        )
        act(By.ID, "h-outcome", lambda e: Select(e).select_by_visible_text("failed"))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#history-pager .range"), "1–1 of 1"))
        history_row = 'return document.querySelector(`#history tr[data-turn="${arguments[0]}"]`)?.textContent'
        assert "ValueError" in wait.until(lambda b: b.execute_script(history_row, failed))
        browser.save_screenshot(str(tmp_path / "dashboard-history.png"))

        # An ended turn's page names the worker that ran it (the click retried if the row was redrawn).
        def open_turn(b: Any) -> bool:
            b.find_element(By.CSS_SELECTOR, f'#history tr[data-turn="{failed}"]').find_element(
                By.LINK_TEXT, failed
            ).click()
            return True

        wait.until(open_turn)
        pid = http.get(f"/v1/turns/{failed}").json()["worker_pid"]
        dts = "[...document.querySelectorAll('#turn-facts dt')]"
        fact = f"return {dts}.find(e => e.textContent === arguments[0])"
        wait.until(
            lambda b: b.execute_script(fact + "?.nextElementSibling.textContent", "worker pid") == str(pid)
        )
        print(f"screenshots: {tmp_path}")
