"""A real headless Chromium for the dashboard's tests: Debian's ``chromium`` and its matching
``chromium-driver``, driven by selenium. Nothing is downloaded at run time: the browser and the
driver come from the system (``.ci/run`` installs them), selenium from PyPI.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


def missing() -> str | None:
    """Why a browser test cannot run here (``None``: it can)."""
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        return "needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium (the test extra)"
    return None


@contextlib.contextmanager
def chromium(log: Path, size: tuple[int, int] = (1280, 1000)) -> Iterator[Any]:
    """A fresh headless Chromium (its own profile directory) for the duration of the block."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tp-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(log))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
