"""Fixtures of the console's browser tests (see browser.py): one Chromium for the session, a clean
page (no cookies, no console messages left) for each test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver

sys.path.insert(0, str(Path(__file__).resolve().parent))

from browser import browser_log, chromium, chromium_missing


@pytest.fixture(scope="session")
def chromium_session() -> Iterator[WebDriver]:
    """The session's headless Chromium (started once: about a second and a half)."""
    missing = chromium_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing} (CI=true: the browser tests must run on CI)")
        pytest.skip(missing)
    with chromium() as driver:
        yield driver


@pytest.fixture
def browser(chromium_session: WebDriver) -> Iterator[WebDriver]:
    """The session's Chromium on a blank page, with no cookies and no console messages left over."""
    driver = chromium_session
    driver.get("about:blank")
    # Every console of the session is on 127.0.0.1, and cookies ignore ports: clear them all.
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    browser_log(driver)
    yield driver
    try:  # a dialog a failed test left open would block the next test's navigation
        driver.switch_to.alert.dismiss()
    except Exception:
        pass
    driver.get("about:blank")
