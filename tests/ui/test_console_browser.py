"""The run console in a real browser: headless Chromium driving ``graphflow-durable ui`` served in
its own process, against stores that ``graphflow-durable worker`` processes and in-process teams
fill. What a person does with it (answer the inbox, watch a run live, act on runs) and what it must
refuse (scripts in messages, cross-origin and token-less POSTs, actions in read-only mode, pages
without the login)."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import uiteam
from browser import ROOT, alert_text, browser_log, screenshot, served_console, stop, wait_for, worker
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from graphflow_durable import DurableGraphFlow, Store

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

EXAMPLES = ROOT / "examples"

PAYLOADS = (
    "<script>window.__pwned = 'script'; alert(1)</script>",
    "<img src=x onerror=\"window.__pwned = 'img'; alert(1)\">",
    "<a href=\"javascript:window.__pwned = 'link'; alert(1)\">click me</a>",
    "<svg onload=\"window.__pwned = 'svg'; alert(1)\"><circle r=9></circle></svg>",
    "javascript:window.__pwned = 'bare'",
    "\"><script>window.__pwned = 'attr'</script><p title=\"",
)


# -- helpers ---------------------------------------------------------------------------------------


def drive(url: str, team: DurableGraphFlow | None = None, *, task: str | None = None) -> str:
    """Run ``team`` (built with ``store=`` a Store on ``url``) in this process until it returns; its status."""
    assert team is not None
    asyncio.run(team.run(task=task))
    run = team.store.get_run(team.run_id)
    assert run is not None
    return str(run.status)


def waiting_run(url: str, run_id: str) -> None:
    """A run of the approval team parked ``waiting`` for a person (driven in this process)."""
    with Store(url) as store:
        assert drive(url, uiteam.approval(run_id, store=store), task="Refund order 1234?") == "waiting"


def failed_run(url: str, run_id: str) -> None:
    """A run of the flaky team failed on ``summarize``, its one attempt spent."""
    with Store(url) as store:
        team = uiteam.flaky(run_id, store=store)
        with contextlib.suppress(Exception):
            asyncio.run(team.run(task="Summarize the documents."))
        run = store.get_run(run_id)
        assert run is not None and run.status == "failed", run


def finished_run(url: str, run_id: str, words: tuple[str, ...] = ("one", "two", "three")) -> None:
    with Store(url) as store:
        assert drive(url, uiteam.literal(run_id, words, store=store), task="Say the words.") == "finished"


def status(url: str, run_id: str) -> str | None:
    with Store(url) as store:
        run = store.get_run(run_id)
        return None if run is None else str(run.status)


def errors(driver: WebDriver) -> list[str]:
    """The browser console's errors and CSP reports since the last call (a missing favicon aside)."""
    return [
        str(e["message"])
        for e in browser_log(driver)
        if (e["level"] == "SEVERE" or "Content Security Policy" in str(e["message"]))
        and "favicon" not in str(e["message"])
    ]


def act(driver: WebDriver, action: str, **fields: str) -> None:
    """Fill the fields of the form of ``button[data-action=ACTION]``, press it, accept its
    confirmation, and wait for the page it leads to."""
    button = driver.find_element(By.CSS_SELECTOR, f"button[data-action={action}]")
    form = button.find_element(By.XPATH, "./ancestor::form")
    for name, value in fields.items():
        field = form.find_element(By.CSS_SELECTOR, f"[name={name}]")
        if field.get_attribute("type") == "hidden" or field.tag_name == "select":
            driver.execute_script("arguments[0].value = arguments[1]", field, value)
        else:
            field.clear()
            field.send_keys(value)
    old = driver.find_element(By.TAG_NAME, "html")
    button.click()
    with contextlib.suppress(AssertionError):
        wait_for("a confirmation", lambda: alert_text(driver) is not None, timeout=2)
        driver.switch_to.alert.accept()
    wait_for("the page after the action", lambda: stale(old), timeout=20)
    refused = driver.find_elements(By.CSS_SELECTOR, "[data-error-page='403']")
    assert not refused, f"the console refused the {action}: {refused[0].text}"


def stale(element: WebElement) -> bool:
    try:
        element.tag_name  # noqa: B018
    except Exception:
        return True
    return False


def scrolled_to_graph(driver: WebDriver) -> None:
    """Scroll the run page so that its graph and timeline fill the window."""
    heading = driver.find_element(By.XPATH, "//h2[normalize-space()='Graph']")
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", heading)


def page_text(driver: WebDriver) -> str:
    return str(driver.find_element(By.TAG_NAME, "body").text)


def post_status(driver: WebDriver, path: str, fields: dict[str, str]) -> int:
    """POST ``fields`` as a form to ``path`` from the current page (its cookies); the status code."""
    script = """
        const [path, fields, done] = arguments;
        fetch(path, {method: 'POST', body: new URLSearchParams(fields), credentials: 'same-origin',
                     redirect: 'manual'})
            .then(r => done(r.status), e => done(String(e)));
    """
    return int(driver.execute_async_script(script, path, fields))


@contextlib.contextmanager
def other_origin(html: str) -> Iterator[str]:
    """A second web server (another port: another origin) serving ``html`` at ``/``; its URL."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- the inbox, live pages ------------------------------------------------------------------------


def test_a_person_answers_a_waiting_run_from_the_inbox_and_a_worker_finishes_it(
    store_url: str, browser: WebDriver
) -> None:
    with Store(store_url) as store:
        store.queue.submit("refund-1234", task="Refund order 1234?", team="approval")
    with served_console(store_url) as console, worker(store_url, "approval=uiteam:approval"):
        wait_for(
            "the run to wait for a person", lambda: status(store_url, "refund-1234") == "waiting", timeout=60
        )
        browser.get(f"{console.url}/inbox")
        item = browser.find_element(By.CSS_SELECTOR, "[data-request-id][data-run-id=refund-1234]")
        assert item.get_attribute("data-request-id"), "the inbox item names its request"
        screenshot(browser, "inbox")
        item.find_element(By.CSS_SELECTOR, "textarea[name=text]").send_keys("approved: refund it")
        old = browser.find_element(By.TAG_NAME, "html")
        item.find_element(By.CSS_SELECTOR, "button[data-action=respond]").click()
        with contextlib.suppress(AssertionError):
            wait_for("a confirmation", lambda: alert_text(browser) is not None, timeout=2)
            browser.switch_to.alert.accept()
        wait_for("the page after answering", lambda: stale(old))
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-error-page='403']"), page_text(browser)
        wait_for(
            "the worker to finish the run", lambda: status(store_url, "refund-1234") == "finished", timeout=60
        )
        browser.get(f"{console.url}/runs/refund-1234")
        assert "finished" in page_text(browser)
        states = {
            e.get_attribute("data-node"): e.get_attribute("data-state")
            for e in browser.find_elements(By.CSS_SELECTOR, "[data-node][data-state]")
        }
        assert states == {"draft": "done", "approver": "done", "publish": "done"}
        texts = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "[data-seq]")]
        assert any("approved: refund it" in t for t in texts), texts
        assert any("Refund issued." in t for t in texts), texts
        browser.get(f"{console.url}/inbox")
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-run-id=refund-1234]")
        assert errors(browser) == []
    with Store(store_url) as store:
        said = [(m.body["source"], m.body.get("content")) for m in store.transcript("refund-1234")]
    assert ("approver", "approved: refund it") in said, said


def test_messages_of_a_run_another_process_drives_appear_without_a_reload(
    sqlite_url: str, browser: WebDriver
) -> None:
    with Store(sqlite_url) as store:
        store.queue.submit("live-1", task="Count the steps.", team="slow")
    env = {"UI_AGENT_DELAY": "0.5"}
    with served_console(sqlite_url) as console, worker(sqlite_url, "slow=uiteam:slow", env=env):
        wait_for("the worker to start the run", lambda: status(sqlite_url, "live-1") == "running", timeout=60)
        browser.get(f"{console.url}/runs/live-1")
        browser.execute_script("window.__same_page = true")
        seen = len(browser.find_elements(By.CSS_SELECTOR, "[data-seq]"))
        assert seen < 1 + uiteam.SLOW_STEPS, "the run ended before the page was read: nothing left to watch"
        last = wait_for(
            "every message of the run on the page",
            lambda: (
                len(browser.find_elements(By.CSS_SELECTOR, "[data-seq]")) == 1 + uiteam.SLOW_STEPS
                and browser.find_elements(By.CSS_SELECTOR, f"[data-seq='{uiteam.SLOW_STEPS}']")
            ),
            timeout=30,
        )[0]
        assert browser.execute_script("return window.__same_page") is True, "the page was reloaded"
        assert last.get_attribute("data-source") == f"step{uiteam.SLOW_STEPS}"
        assert f"step {uiteam.SLOW_STEPS} of {uiteam.SLOW_STEPS} done" in last.text
        seqs = [
            int(str(e.get_attribute("data-seq")))
            for e in browser.find_elements(By.CSS_SELECTOR, "[data-seq]")
        ]
        assert seqs == list(range(1 + uiteam.SLOW_STEPS)), "each message once, in order"
        wait_for(
            "the last node drawn done",
            lambda: browser.find_elements(
                By.CSS_SELECTOR, f"[data-node=step{uiteam.SLOW_STEPS}][data-state=done]"
            ),
        )
        assert browser.execute_script("return window.__same_page") is True
        assert errors(browser) == []


# -- actions ----------------------------------------------------------------------------------------


def test_cancel_then_retry_from_the_buttons_move_a_waiting_run(store_url: str, browser: WebDriver) -> None:
    waiting_run(store_url, "approve-7")
    with served_console(store_url) as console:
        browser.get(f"{console.url}/runs/approve-7")
        act(browser, "cancel")
        assert status(store_url, "approve-7") == "cancelled"
        browser.get(f"{console.url}/runs/approve-7")
        assert "cancelled" in page_text(browser)
        act(browser, "retry")
        assert status(store_url, "approve-7") == "interrupted"
        browser.get(f"{console.url}/")
        row = browser.find_element(By.CSS_SELECTOR, "[data-run-id=approve-7]")
        assert row.get_attribute("data-status") == "interrupted"
        assert errors(browser) == []


def test_supply_from_the_button_answers_the_node_a_run_failed_on(sqlite_url: str, browser: WebDriver) -> None:
    failed_run(sqlite_url, "summary-3")
    with served_console(sqlite_url) as console:
        browser.get(f"{console.url}/runs/summary-3")
        failed = browser.find_element(By.CSS_SELECTOR, "[data-node=summarize]")
        assert failed.get_attribute("data-state") == "failed"
        form = browser.find_element(By.CSS_SELECTOR, "button[data-action=supply]").find_element(
            By.XPATH, "./ancestor::form"
        )
        fields = {"text": "The three documents agree: ship it."}
        if form.find_element(By.CSS_SELECTOR, "[name=node]").get_attribute("type") != "hidden":
            fields["node"] = "summarize"
        act(browser, "supply", **fields)
        assert status(sqlite_url, "summary-3") == "interrupted"
        with Store(sqlite_url) as store:
            last = store.transcript("summary-3")[-1].body
        assert (last["source"], last["content"]) == ("summarize", "The three documents agree: ship it.")
        browser.get(f"{console.url}/runs/summary-3")
        assert (
            browser.find_element(By.CSS_SELECTOR, "[data-node=summarize]").get_attribute("data-state")
            == "done"
        )
        assert "The three documents agree: ship it." in page_text(browser)
        assert errors(browser) == []


def test_fork_from_the_button_makes_a_new_run_and_links_it(sqlite_url: str, browser: WebDriver) -> None:
    finished_run(sqlite_url, "words-1")
    with served_console(sqlite_url) as console:
        browser.get(f"{console.url}/runs/words-1")
        act(browser, "fork", step="2")
        with Store(sqlite_url) as store:
            forks = [r for r in store.list_runs() if r.parent_run_id == "words-1"]
        assert len(forks) == 1, forks
        fork = forks[0]
        assert fork.run_id != "words-1" and fork.head_seq == 2
        link = browser.find_element(By.CSS_SELECTOR, f"a[href$='/runs/{fork.run_id}']")
        link.click()
        wait_for("the fork's page", lambda: browser.current_url.endswith(f"/runs/{fork.run_id}"))
        assert fork.run_id in page_text(browser)
        assert errors(browser) == []


def test_a_refused_action_shows_the_reason_on_the_page_not_an_error_page(
    sqlite_url: str, browser: WebDriver
) -> None:
    waiting_run(sqlite_url, "approve-8")
    with served_console(sqlite_url) as console:
        browser.get(f"{console.url}/runs/approve-8")
        with Store(sqlite_url) as store:  # someone else cancels it meanwhile
            store.cancel_run("approve-8")
        act(browser, "cancel")
        text = page_text(browser)
        assert "Traceback" not in text
        assert "cancel" in text.lower()
        assert status(sqlite_url, "approve-8") == "cancelled"


def test_delete_from_the_button_removes_the_run_and_its_page_then_is_a_404(
    sqlite_url: str, browser: WebDriver
) -> None:
    finished_run(sqlite_url, "words-2")
    with served_console(sqlite_url) as console:
        browser.get(f"{console.url}/runs/words-2")
        act(browser, "delete")
        assert status(sqlite_url, "words-2") is None
        browser.get(f"{console.url}/runs/words-2")
        text = page_text(browser)
        assert "404" in text and "Traceback" not in text
        browser.get(f"{console.url}/")
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-run-id=words-2]")


def test_an_answer_after_someone_else_answered_is_refused_with_a_clear_message(
    sqlite_url: str, browser: WebDriver
) -> None:
    waiting_run(sqlite_url, "approve-13")
    with served_console(sqlite_url) as console:
        browser.get(f"{console.url}/inbox")
        item = browser.find_element(By.CSS_SELECTOR, "[data-request-id][data-run-id=approve-13]")
        with Store(sqlite_url) as store:  # another person, meanwhile
            store.respond("approve-13", "rejected: not this month")
        item.find_element(By.CSS_SELECTOR, "textarea[name=text]").send_keys("approved")
        act(browser, "respond")
        text = page_text(browser)
        assert "Traceback" not in text and "500" not in text
        assert "run approve-13 has request 'approver/3' answered; nothing was changed" in text, text
        with Store(sqlite_url) as store:
            [request] = store.requests.of_run("approve-13")
        assert (request.status, request.answer) == ("answered", "rejected: not this month"), (
            "the first answer stays"
        )
        browser.get(f"{console.url}/inbox")
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-run-id=approve-13]")


# -- what must not happen -------------------------------------------------------------------------


def test_scripts_in_messages_do_not_run_and_their_text_is_shown_literally(
    store_url: str, browser: WebDriver
) -> None:
    finished_run(store_url, "hostile-1", PAYLOADS)
    with served_console(store_url) as console:
        for path in ("/", "/runs/hostile-1", "/api/runs/hostile-1", "/runs/hostile-1"):
            browser.get(f"{console.url}{path}")
            assert alert_text(browser) is None, f"an alert opened on {path}"
            assert browser.execute_script("return window.__pwned") is None, path
        messages = {
            int(str(e.get_attribute("data-seq"))): e
            for e in browser.find_elements(By.CSS_SELECTOR, "[data-seq]")
        }
        for seq, payload in enumerate(PAYLOADS, 1):
            shown = [messages[seq], *messages[seq].find_elements(By.XPATH, ".//*")]
            assert any(e.text == payload for e in shown), (payload, messages[seq].text)
            assert messages[seq].get_attribute("data-source") == f"say{seq}"
        assert not browser.find_elements(By.CSS_SELECTOR, "a[href^='javascript']")
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-seq] script, [data-seq] img, [data-seq] svg")
        for link in browser.find_elements(By.CSS_SELECTOR, "[data-seq] a"):
            link.click()
            assert alert_text(browser) is None
        assert browser.execute_script("return window.__pwned") is None
        assert errors(browser) == []


def test_a_post_from_another_origin_is_refused_even_with_a_valid_csrf_token(
    sqlite_url: str, browser: WebDriver
) -> None:
    waiting_run(sqlite_url, "approve-9")
    with served_console(sqlite_url) as console:
        browser.get(f"{console.url}/runs/approve-9")
        form = browser.find_element(By.CSS_SELECTOR, "button[data-action=cancel]").find_element(
            By.XPATH, "./ancestor::form"
        )
        token = form.find_element(By.CSS_SELECTOR, "[name=csrf]").get_attribute("value")
        assert token
        attack = (
            f'<form id=f method=post action="{console.url}/runs/approve-9/cancel">'
            f'<input type=hidden name=csrf value="{token}"></form>'
            "<script>document.getElementById('f').submit()</script>"
        )
        with other_origin(attack) as evil:
            browser.get(evil)
            wait_for("the forged POST's answer", lambda: browser.current_url.startswith(console.url))
        assert "403" in page_text(browser) or "refused" in page_text(browser).lower()
        assert status(sqlite_url, "approve-9") == "waiting"


def test_a_post_without_the_csrf_token_is_refused(store_url: str, browser: WebDriver) -> None:
    waiting_run(store_url, "approve-10")
    with served_console(store_url) as console:
        browser.get(f"{console.url}/runs/approve-10")
        assert post_status(browser, "/runs/approve-10/cancel", {}) == 403
        assert post_status(browser, "/runs/approve-10/cancel", {"csrf": "forged"}) == 403
        assert status(store_url, "approve-10") == "waiting"
        token = str(browser.find_element(By.CSS_SELECTOR, "[name=csrf]").get_attribute("value"))
        assert post_status(browser, "/runs/approve-10/cancel", {"csrf": token}) in (200, 303, 0)
        assert status(store_url, "approve-10") == "cancelled"


def test_read_only_mode_shows_no_action_and_refuses_every_post(sqlite_url: str, browser: WebDriver) -> None:
    waiting_run(sqlite_url, "approve-11")
    failed_run(sqlite_url, "summary-11")
    with served_console(sqlite_url, "--read-only") as console:
        for path in ("/", "/inbox", "/runs/approve-11", "/runs/summary-11", "/stats"):
            browser.get(f"{console.url}{path}")
            assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action]"), path
        browser.get(f"{console.url}/inbox")
        assert browser.find_elements(By.CSS_SELECTOR, "[data-request-id][data-run-id=approve-11]"), (
            "read-only still lists the inbox"
        )
        for action in ("cancel", "retry", "delete", "respond"):
            assert post_status(browser, f"/runs/approve-11/{action}", {"text": "no"}) == 403, action
        assert status(sqlite_url, "approve-11") == "waiting"


@pytest.mark.postgres
def test_the_store_urls_password_appears_on_no_page(postgres_database: str, browser: WebDriver) -> None:
    """The throwaway server trusts local connections: the password is given, and never checked."""
    url = (
        sa.make_url(postgres_database)
        .set(password="pw-never-shown-4711")
        .render_as_string(hide_password=False)
    )
    waiting_run(url, "approve-14")
    failed_run(url, "summary-14")
    with served_console(url) as console:
        for path in ("/", "/inbox", "/stats", "/runs/approve-14", "/runs/summary-14", "/api/runs", "/api/inbox",
                     "/api/runs/summary-14", "/runs/no-such-run", "/runs/bad%20id"):  # fmt: skip
            browser.get(f"{console.url}{path}")
            assert "pw-never-shown-4711" not in browser.page_source, path
        assert "pw-never-shown-4711" not in console.stderr()


def test_with_a_token_the_login_page_lets_a_person_in_with_an_httponly_cookie(
    sqlite_url: str, browser: WebDriver
) -> None:
    waiting_run(sqlite_url, "approve-12")
    with served_console(sqlite_url, "--token", "s3cret-token-for-the-test") as console:
        browser.get(f"{console.url}/")
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-run-id]"), "runs shown without the login"
        screenshot(browser, "login")

        def log_in(token: str) -> None:
            field = browser.find_element(By.CSS_SELECTOR, "input[type=password], input[name=token]")
            field.clear()
            field.send_keys(token)
            old = browser.find_element(By.TAG_NAME, "html")
            field.submit()
            wait_for("the page after the login", lambda: stale(old))

        log_in("not-the-token")
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-run-id]")
        log_in("s3cret-token-for-the-test")
        browser_log(browser)  # the 401s before the login
        browser.get(f"{console.url}/")
        assert browser.find_element(By.CSS_SELECTOR, "[data-run-id=approve-12]")
        cookies = browser.get_cookies()
        assert cookies, "no session cookie"
        assert all(c.get("httpOnly") for c in cookies), cookies
        assert all(c.get("sameSite") == "Strict" for c in cookies), cookies
        assert browser.execute_script("return document.cookie") == ""
        assert "s3cret-token-for-the-test" not in browser.page_source
        assert errors(browser) == []


# -- the demo, and the pictures of it -----------------------------------------------------------------


@pytest.mark.slow
def test_the_console_demo_shows_its_runs_and_a_person_finishes_the_waiting_one(
    tmp_path: Path, browser: WebDriver
) -> None:
    """``examples/console_demo.py`` as a newcomer runs it; the screenshots of the runs page, the
    inbox and run pages (``build/screenshots/demo-*.png``; docs/console.png is one of them)."""
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    demo = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "console_demo.py"), "--store", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "WORKER_POOL_DELAY": "0.3"},
    )
    try:
        assert demo.stdout is not None
        line = wait_for("the demo's console address", lambda: demo.stdout.readline() or None, timeout=60)
        while not line.startswith("the console: "):
            line = demo.stdout.readline()
            assert line, "the demo ended before it printed the console's address"
        base = line.split()[2].rstrip("/")
        expected = {f"report-{i}": "finished" for i in range(4)} | {
            "refund-1234": "waiting",
            "digest-7": "failed",
        }
        wait_for(
            "the demo's runs to settle",
            lambda: all(status(url, run_id) == want for run_id, want in expected.items()),
            timeout=60,
        )
        browser.get(f"{base}/")
        rows = {
            e.get_attribute("data-run-id"): e.get_attribute("data-status")
            for e in browser.find_elements(By.CSS_SELECTOR, "[data-run-id][data-status]")
        }
        assert rows == expected
        screenshot(browser, "demo-runs")
        browser.get(f"{base}/runs/digest-7")
        assert (
            browser.find_element(By.CSS_SELECTOR, "[data-node=summarize]").get_attribute("data-state")
            == "failed"
        )
        screenshot(browser, "demo-run-failed")
        scrolled_to_graph(browser)
        screenshot(browser, "demo-run-failed-graph")
        browser.get(f"{base}/runs/report-0")
        assert {
            e.get_attribute("data-state")
            for e in browser.find_elements(By.CSS_SELECTOR, "[data-node][data-state]")
        } == {"done"}
        screenshot(browser, "demo-run-finished")
        scrolled_to_graph(browser)
        screenshot(browser, "demo-run-finished-graph")  # docs/console.png
        browser.get(f"{base}/inbox")
        screenshot(browser, "demo-inbox")
        item = browser.find_element(By.CSS_SELECTOR, "[data-request-id][data-run-id=refund-1234]")
        item.find_element(By.CSS_SELECTOR, "textarea[name=text]").send_keys("Approved: refund the 42 EUR.")
        old = browser.find_element(By.TAG_NAME, "html")
        item.find_element(By.CSS_SELECTOR, "button[data-action=respond]").click()
        with contextlib.suppress(AssertionError):
            wait_for("a confirmation", lambda: alert_text(browser) is not None, timeout=2)
            browser.switch_to.alert.accept()
        wait_for("the page after answering", lambda: stale(old))
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-error-page='403']"), page_text(browser)
        wait_for(
            "the worker to finish the refund", lambda: status(url, "refund-1234") == "finished", timeout=60
        )
        browser.get(f"{base}/runs/refund-1234")
        screenshot(browser, "demo-run-answered")
        scrolled_to_graph(browser)
        screenshot(browser, "demo-run-answered-graph")
        assert errors(browser) == []
    finally:
        code = stop(demo, timeout=30)
        demo.stdout.close()  # type: ignore[union-attr]
    assert code == 0, "the demo stops cleanly on SIGTERM"
