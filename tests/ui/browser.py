"""What the console's browser tests drive: the distribution's headless Chromium through its
chromedriver (Selenium 4, nothing downloaded: the network is closed), the console served for real by
``graphflow-durable ui`` in a subprocess, and ``graphflow-durable worker`` processes.

Screenshots go to ``build/screenshots/NAME.png`` (git-ignored): the test artifacts.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCREENSHOTS = ROOT / "build" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
]
URL_LINE = "graphflow-durable ui: "

T = TypeVar("T")


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None (scripts/test.sh installs both)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (Path(path).exists() or shutil.which(Path(path).name)):
            return f"{path} is not installed (apt-get install chromium chromium-driver; scripts/test.sh does)"
    return None


@contextlib.contextmanager
def chromium() -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile, its console messages kept for :func:`browser_log`."""
    profile = tempfile.mkdtemp(prefix="gfd-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if Path(CHROMEDRIVER).exists() else str(shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def browser_log(driver: WebDriver) -> list[dict[str, Any]]:
    """The browser's console messages since the last call (errors, CSP violations, ``console.*``)."""
    return list(driver.get_log("browser"))


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save the window as ``build/screenshots/NAME.png``; return the path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot saved to {path}"
    return path


def alert_text(driver: WebDriver) -> str | None:
    """The text of an open alert/confirm dialog, or None."""
    try:
        return str(driver.switch_to.alert.text)
    except NoAlertPresentException:
        return None


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 20.0, every: float = 0.05) -> T:
    """Call ``probe`` until it returns something truthy (returned); fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def stop(proc: subprocess.Popen[Any], *, timeout: float = 10.0) -> int:
    """SIGTERM ``proc``, then SIGKILL it if it has not exited within ``timeout``; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return int(proc.returncode)


def command(*args: str) -> list[str]:
    """``graphflow-durable ARGS`` as installed beside this interpreter (as a user runs it)."""
    script = Path(sys.executable).parent / "graphflow-durable"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "graphflow_durable.cli.runs", *args]


class Console:
    """A ``graphflow-durable ui`` process: :attr:`url` (``http://HOST:PORT``, no trailing slash)."""

    def __init__(self, proc: subprocess.Popen[str], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def served_console(store_url: str, *args: str, env: dict[str, str] | None = None) -> Iterator[Console]:
    """Start ``graphflow-durable ui --store URL --port 0 ARGS``, read its address from the first
    line of its stdout, yield it; stop it (SIGTERM, then SIGKILL) whatever happens."""
    logdir = Path(tempfile.mkdtemp(prefix="gfd-console-"))
    log = logdir / "stderr.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            command("ui", "--store", store_url, "--port", "0", *args),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, **(env or {})},
        )
    reader: threading.Thread | None = None
    try:
        assert proc.stdout is not None
        line = _first_line(proc, timeout=30)
        assert line.startswith(URL_LINE), f"first stdout line {line!r}; stderr: {log.read_text()[-2000:]}"
        url = line[len(URL_LINE) :].strip().rstrip("/")
        # Keep reading its stdout so the pipe never fills.
        reader = threading.Thread(target=proc.stdout.read, daemon=True)
        reader.start()
        yield Console(proc, url, log)
    finally:
        stop(proc)
        if reader is not None:
            reader.join(10)  # its read ends at the pipe's end, once the process exited
        if reader is None or not reader.is_alive():
            proc.stdout.close()  # type: ignore[union-attr]
        shutil.rmtree(logdir, ignore_errors=True)


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"graphflow-durable ui printed no address within {timeout}s")
    return proc.stdout.readline()


@contextlib.contextmanager
def worker(
    store_url: str, *teams: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``graphflow-durable worker`` on ``store_url`` for ``teams`` (``key=uiteam:factory``),
    importing this directory's modules; stopped (SIGTERM, then SIGKILL) at the end."""
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    team_args = [arg for team in teams for arg in ("--team", team)]
    proc = subprocess.Popen(
        command(
            "worker", "--store", store_url, *team_args, "--poll-interval", "0.1", "--lease-seconds", "10"
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )
    try:
        yield proc
    finally:
        stop(proc, timeout=20)
