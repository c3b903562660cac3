"""The run console in-process (Starlette's TestClient), on SQLite and PostgreSQL: every route, the
filters and keyset pages, the inbox's answers, each action and its refusal, the token, CSRF,
same-origin and read-only rules, the security headers, escaping, 404 and 503."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import close_stores
from graphflow_durable.store import Store
from integration.test_store_admin import made

from .helpers import XSS, client, csrf_of, failed_run, finished_run, waiting_run

CSP = "default-src 'self'; script-src 'self'"


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with Store(store_url) as opened:
        yield opened


def rows(html: str) -> list[tuple[str, str]]:
    """The runs table's (run id, status) pairs, in page order."""
    return re.findall(r'<tr data-run-id="([^"]+)" data-status="([^"]+)">', html)


def post(c, path: str, page: str, **fields: str):  # type: ignore[no-untyped-def]
    """POST a form from ``page`` (a GET path) with its CSRF token."""
    token = csrf_of(c.get(page).text)
    return c.post(path, data={"csrf": token, **fields})


async def test_every_page_and_api_route_answers_with_its_hooks(store_url: str, store: Store) -> None:
    await finished_run(store_url, "done-1")
    await waiting_run(store_url, "asks-1")
    c = client(store)
    page = c.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert set(rows(page.text)) == {("done-1", "finished"), ("asks-1", "waiting")}
    assert 'data-count="waiting"' in page.text
    inbox = c.get("/inbox").text
    assert 'data-request-id="H/' in inbox and 'data-run-id="asks-1"' in inbox
    assert '<textarea name="text"' in inbox and 'data-action="respond"' in inbox
    run = c.get("/runs/done-1").text
    seqs = re.findall(r'<li class="message" data-seq="(\d+)" data-source="([^"]+)"', run)
    assert seqs == [("0", "user"), ("1", "A"), ("2", "B")]
    assert re.search(r'data-node="A"[^>]*data-state="done"', run), "the graph draws each node's state"
    for action in ("cancel", "retry", "supply", "fork", "delete"):
        assert f'data-action="{action}"' in run
    assert 'href="/runs/done-1/export"' in run
    stats = c.get("/stats").text
    assert 'data-stat="queue-depth"' in stats and "graphflow_runs" in stats
    assert c.get("/runs/done-1/export").json()["run"]["run_id"] == "done-1"
    assert "attachment" in c.get("/runs/done-1/export").headers["content-disposition"]

    listed = c.get("/api/runs").json()
    assert {r["run_id"] for r in listed["runs"]} == {"done-1", "asks-1"} and listed["next"] is None
    cli_fields = {"run_id", "status", "team", "head", "messages", "lease_owner", "lease_expires_at"}
    cli_fields |= {"lease_state", "lease_host", "lease_pid", "attempts", "last_error", "pending"}
    cli_fields |= {"queue", "priority", "partition", "content"}
    assert all(set(r) == cli_fields for r in listed["runs"])
    shown = c.get("/api/runs/done-1").json()
    assert (shown["status"], shown["round"], shown["head_step"]["kind"]) == ("finished", 1, "complete")
    assert c.get("/api/runs?status=waiting").json()["runs"][0]["pending"][0]["node"] == "H"
    assert [m["seq"] for m in c.get("/api/runs/done-1/transcript").json()] == [0, 1, 2]
    assert c.get("/api/runs/done-1/history").json()[0]["seq"] == 1
    assert [r["run_id"] for r in c.get("/api/inbox").json()] == ["asks-1"]


def test_the_api_fields_are_the_cli_json_fields(
    store_url: str, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    from graphflow_durable.cli.runs import main

    made(store, "r1", status="interrupted")
    assert main(["runs", "list", "--json", "--store", store_url]) == 0
    listed = json.loads(capsys.readouterr().out.splitlines()[0])
    assert main(["runs", "show", "r1", "--json", "--store", store_url]) == 0
    shown = json.loads(capsys.readouterr().out)
    c = client(store)
    api_listed = c.get("/api/runs").json()["runs"][0]
    assert set(api_listed) == set(listed) and api_listed["run_id"] == listed["run_id"]
    api_shown = c.get("/api/runs/r1").json()
    assert set(api_shown) == set(shown) and api_shown["head"] == shown["head"]


def test_runs_are_listed_newest_first_filtered_and_paged_by_a_keyset_cursor(store: Store) -> None:
    for n in range(7):
        made(store, f"run-{n}", status="interrupted" if n % 2 else "finished")
    c = client(store)
    assert [r for r, _ in rows(c.get("/").text)] == [f"run-{n}" for n in reversed(range(7))]
    seen, after = [], ""
    while True:
        got = c.get(f"/api/runs?limit=3{after}").json()
        seen.append([r["run_id"] for r in got["runs"]])
        if got["next"] is None:
            break
        after = f"&after={got['next']}"
    assert seen == [["run-6", "run-5", "run-4"], ["run-3", "run-2", "run-1"], ["run-0"]]
    cursor = c.get("/api/runs?limit=3").json()["next"]
    made(store, "run-new", status="finished")  # a run made meanwhile does not shift the next page
    assert [r for r, _ in rows(c.get("/", params={"after": cursor}).text)] == [
        "run-3",
        "run-2",
        "run-1",
        "run-0",
    ]
    assert [r for r, _ in rows(c.get("/?status=interrupted").text)] == ["run-5", "run-3", "run-1"]
    assert [r for r, _ in rows(c.get("/?q=-4").text)] == ["run-4"]
    assert rows(c.get("/?q=%25").text) == []  # LIKE's wildcard is text here
    page = c.get("/").text
    assert re.search(r'data-count="interrupted">interrupted <b>3</b>', page)
    assert 'href="/?status=finished"' in page


def test_bad_query_and_path_values_are_400_or_404_never_a_traceback(store: Store) -> None:
    made(store, "r1", status="finished")
    c = client(store)
    for path in ("/?status=bogus", "/?after=nonsense", "/api/runs?limit=0", "/api/runs?limit=x", "/?q=%00"):
        got = c.get(path)
        assert got.status_code == 400, path
        assert "Traceback" not in got.text
    assert c.get("/api/runs?status=bogus").json()["status"] == 400
    assert c.get("/runs/nobody").status_code == 404
    assert c.get("/api/runs/nobody").json() == {"error": "run nobody does not exist", "status": 404}
    assert c.get("/runs/nobody/events").status_code == 404
    assert c.get("/runs/r1/events?after=x").status_code == 400
    assert c.get("/no/such/page").status_code == 404
    assert post(c, "/runs/nobody/respond", "/runs/r1", text="yes", request_id="H/1").status_code == 404
    assert post(c, "/runs/nobody/cancel", "/runs/r1").status_code == 404


async def test_answering_from_the_inbox_goes_through_respond_and_a_second_answer_is_refused_clearly(
    store_url: str, store: Store
) -> None:
    await waiting_run(store_url, "asks-1")
    c = client(store)
    request_id = store.pending_requests("asks-1")[0].request_id
    answered = post(c, "/runs/asks-1/respond", "/inbox", text="yes, refund", request_id=request_id)
    assert answered.status_code == 200 and "answered" in answered.text
    assert store.get_run("asks-1").status == "interrupted"  # type: ignore[union-attr]
    assert 'data-request-id="' not in answered.text  # the inbox is empty now
    again = post(c, "/runs/asks-1/respond", "/runs/asks-1", text="no", request_id=request_id)
    assert again.status_code == 409 and "data-error" in again.text and "<h1>Inbox" in again.text
    refusal = re.search(r"data-error>([^<]*)<", again.text)
    assert refusal is not None and "answered; nothing was changed" in refusal.group(1)
    empty = post(c, "/runs/asks-1/respond", "/runs/asks-1", text="  ", request_id=request_id)
    assert empty.status_code == 400


async def test_cancel_retry_and_delete_act_and_refuse_in_the_cli_words(store_url: str, store: Store) -> None:
    made(store, "idle", status="interrupted")
    await finished_run(store_url, "done")
    c = client(store)
    got = post(c, "/runs/idle/cancel", "/runs/idle")
    assert got.status_code == 200 and "cancelled (nobody was driving it)" in got.text
    assert store.get_run("idle").status == "cancelled"  # type: ignore[union-attr]
    got = post(c, "/runs/idle/retry", "/runs/idle")
    assert got.status_code == 200 and "queued again" in got.text
    assert store.get_run("idle").status == "interrupted"  # type: ignore[union-attr]
    for action in ("cancel", "retry"):
        refused = post(c, f"/runs/done/{action}", "/runs/done")
        assert refused.status_code == 409 and "data-error" in refused.text
        with pytest.raises(Exception) as cli_error:
            getattr(store, {"cancel": "cancel_run", "retry": "retry_run"}[action])("done")
        assert str(cli_error.value).split(";")[0] in refused.text.replace("&#39;", "'")
    gone = post(c, "/runs/idle/delete", "/runs/idle")
    assert gone.status_code == 200 and "deleted" in gone.text and store.get_run("idle") is None
    assert c.get("/runs/idle").status_code == 404


async def test_supply_answers_a_failed_node_and_refuses_another_node(store_url: str, store: Store) -> None:
    await failed_run(store_url, "bad")
    c = client(store)
    page = c.get("/runs/bad").text
    assert 'name="node" value="B"' in page  # the node it failed on, filled in
    assert "ConnectionError: B is down" in c.get("/").text  # the runs list's last error
    wrong = post(c, "/runs/bad/supply", "/runs/bad", node="C", text="x")
    assert wrong.status_code == 400 and "B" in wrong.text and store.get_run("bad").status == "failed"  # type: ignore[union-attr]
    got = post(c, "/runs/bad/supply", "/runs/bad", node="B", text="B's answer")
    assert got.status_code == 200 and "answer supplied" in got.text
    assert store.get_run("bad").status == "interrupted"  # type: ignore[union-attr]
    assert "B&#39;s answer" in got.text  # in the transcript now, as text


async def test_fork_shows_the_new_run_with_a_link_and_refuses_a_step_out_of_range(
    store_url: str, store: Store
) -> None:
    await finished_run(store_url, "src")
    c = client(store)
    got = post(c, "/runs/src/fork", "/runs/src", step="2")
    assert got.status_code == 200
    new = re.search(r'data-new-run="([^"]+)"', got.text)
    assert new is not None and store.get_run(new.group(1)) is not None
    assert f'href="/runs/{new.group(1)}"' in got.text
    assert f'data-nested="{new.group(1)}"' in c.get("/runs/src").text  # the source lists its fork
    assert 'href="/runs/src"' in c.get(f"/runs/{new.group(1)}").text  # and the fork its parent
    bad = post(c, "/runs/src/fork", "/runs/src", step="99")
    assert bad.status_code == 400 and "data-error" in bad.text
    assert post(c, "/runs/src/fork", "/runs/src", step="two").status_code == 400


def test_a_token_needs_a_login_or_a_bearer_header(store: Store) -> None:
    made(store, "r1", status="finished")
    c = client(store, token="s3cret")
    page = c.get("/")
    assert page.status_code == 401 and 'name="token"' in page.text and "r1" not in page.text
    api = c.get("/api/runs")
    assert api.status_code == 401 and api.json()["status"] == 401
    assert c.get("/api/runs", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/api/runs", headers={"authorization": "Bearer s3cret"}).json()["runs"][0]["run_id"] == "r1"
    assert c.get("/static/console.js").status_code == 200  # the login page's assets
    login = c.get("/login")
    wrong = c.post("/login", data={"csrf": csrf_of(login.text), "token": "nope", "next": "/"})
    assert wrong.status_code == 401 and "wrong token" in wrong.text
    ok = c.post("/login", data={"csrf": csrf_of(login.text), "token": "s3cret", "next": "/runs/r1"})
    assert ok.status_code == 303 and ok.headers["location"] == "/runs/r1"
    cookie = next(h for h in ok.headers.get_list("set-cookie") if h.startswith("gfd_auth="))
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert "s3cret" not in cookie  # the token itself is never stored in the browser
    assert c.get("/").status_code == 200 and rows(c.get("/").text) == [("r1", "finished")]
    offsite = c.post(
        "/login", data={"csrf": csrf_of(login.text), "token": "s3cret", "next": "//evil.example"}
    )
    assert offsite.headers["location"] == "/"


def test_a_post_without_the_csrf_token_or_from_another_origin_is_refused(store: Store) -> None:
    made(store, "r1", status="interrupted")
    c = client(store)
    token = csrf_of(c.get("/runs/r1").text)
    assert c.post("/runs/r1/cancel", data={}).status_code == 403
    assert c.post("/runs/r1/cancel", data={"csrf": "forged"}).status_code == 403
    other = client(store)  # another browser's session: its token is not this one's
    assert other.post("/runs/r1/cancel", data={"csrf": token}).status_code == 403
    foreign = {"origin": "http://evil.example"}
    assert c.post("/runs/r1/cancel", data={"csrf": token}, headers=foreign).status_code == 403
    cross = {"sec-fetch-site": "cross-site"}
    assert c.post("/runs/r1/cancel", data={"csrf": token}, headers=cross).status_code == 403
    assert store.get_run("r1").status == "interrupted"  # type: ignore[union-attr]
    same = {"origin": "http://testserver"}
    assert c.post("/runs/r1/cancel", data={"csrf": token}, headers=same).status_code == 200
    assert store.get_run("r1").status == "cancelled"  # type: ignore[union-attr]


def test_a_cross_origin_post_is_refused_whatever_the_token(store: Store) -> None:
    made(store, "r1", status="interrupted")
    c = client(store, token="s3cret")
    bearer = {"authorization": "Bearer s3cret", "origin": "http://evil.example"}
    assert c.post("/runs/r1/cancel", data={"csrf": "x"}, headers=bearer).status_code == 403
    assert store.get_run("r1").status == "interrupted"  # type: ignore[union-attr]


async def test_read_only_shows_no_action_and_refuses_every_post(store_url: str, store: Store) -> None:
    await waiting_run(store_url, "asks-1")
    c = client(store, read_only=True)
    for path in ("/", "/inbox", "/runs/asks-1"):
        html = c.get(path).text
        assert "data-action=" not in html.replace('data-action="export"', ""), path
        assert 'method="post"' not in html, path
    token = "a form's token: no form is shown to take one from"
    request_id = store.pending_requests("asks-1")[0].request_id
    for action in ("respond", "cancel", "retry", "supply", "fork", "delete"):
        got = c.post(f"/runs/asks-1/{action}", data={"csrf": token, "text": "x", "request_id": request_id})
        assert got.status_code == 403, action
    assert store.get_run("asks-1").status == "waiting"  # type: ignore[union-attr]


def test_every_response_carries_the_security_headers(store: Store) -> None:
    made(store, "r1", status="finished")
    c = client(store)
    for method, path in (
        ("GET", "/"),
        ("GET", "/runs/nobody"),
        ("GET", "/api/runs"),
        ("GET", "/static/console.css"),
        ("POST", "/runs/r1/cancel"),
    ):
        got = c.request(method, path)
        assert got.headers["content-security-policy"].startswith(CSP), path
        assert "frame-ancestors 'none'" in got.headers["content-security-policy"]
        assert got.headers["x-content-type-options"] == "nosniff"
        assert got.headers["referrer-policy"] == "same-origin"
    cookie = c.get("/").headers.get("set-cookie") or ""
    html = client(store).get("/runs/r1").text
    assert "<script>" not in html and " onclick=" not in html and "style=" not in html
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/console.js" defer>']
    assert cookie == "" or "HttpOnly" in cookie


async def test_text_from_models_tasks_and_people_is_shown_escaped(store_url: str, store: Store) -> None:
    await finished_run(store_url, "xss", task=XSS)
    c = client(store)
    for path in ("/runs/xss", "/"):
        html = c.get(path).text
        assert "<script>alert" not in html and "<img src=x" not in html
    html = c.get("/runs/xss").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert c.get("/api/runs/xss/transcript").json()[0]["message"]["content"] == XSS


def test_a_mounted_console_links_under_its_mount_path(store: Store) -> None:
    import warnings

    from starlette.applications import Starlette
    from starlette.routing import Mount

    from graphflow_durable.ui import create_app

    made(store, "r1", status="finished")
    outer = Starlette(routes=[Mount("/console", create_app(store))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # StarletteDeprecationWarning: httpx2 is not installed
        from starlette.testclient import TestClient

        c = TestClient(outer)
    html = c.get("/console/").text
    assert 'href="/console/runs/r1"' in html and 'src="/console/static/console.js"' in html
    assert c.get("/console/runs/r1").status_code == 200
    assert c.get("/console/api/runs").json()["runs"][0]["run_id"] == "r1"


def test_the_database_down_is_a_503_page_of_one_line_and_the_console_recovers(tmp_path: Path) -> None:
    home = tmp_path / "db"
    home.mkdir()
    with Store(f"sqlite:///{home / 'runs.db'}") as store:
        made(store, "r1", status="finished")
        c = client(store)
        assert c.get("/").status_code == 200
        home.rename(tmp_path / "away")  # the database is gone: every new connection fails
        for engine in {id(e): e for e in (store._e.engine, store._e.read, store._e.write)}.values():
            engine.dispose()
        for path in ("/", "/runs/r1", "/inbox", "/stats"):
            down = c.get(path)
            assert down.status_code == 503, path
            line = re.search(r'data-error-page="503">([^<]*)<', down.text)
            assert line is not None and "\n" not in line.group(1) and "unavailable" in line.group(1)
            assert "Traceback" not in down.text
        assert c.get("/api/runs").json()["status"] == 503
        (tmp_path / "away").rename(home)
        assert c.get("/").status_code == 200 and rows(c.get("/").text) == [("r1", "finished")]


async def test_the_runs_list_names_the_node_each_run_runs_or_waits_on_now(
    store_url: str, store: Store
) -> None:
    from graphflow_durable._storage.driver import CommitRequest
    from graphflow_durable.store import MessageRecord, Step

    await waiting_run(store_url, "asks-1")
    token = made(store, "busy")  # running, held by its driver
    store._driver.commit(
        CommitRequest(
            "busy",
            expected_head=1,
            fencing_token=token,
            step=Step(kind="complete", node="a", scheduler={"attempts": {"writer": 1, "critic": 2}}),
            messages=[MessageRecord(seq=1, body={"type": "TextMessage", "content": "x"}, published=True)],
        )
    )
    html = client(store).get("/").text
    now = dict(
        re.findall(r'data-run-id="([^"]+)" data-status="[^"]+">(?:.*?<td>){5}([^<]*)</td>', html, re.S)
    )
    assert now == {"busy": "critic, writer", "asks-1": "H"}


def test_the_runs_page_links_the_next_page_by_its_cursor_and_sets_a_strict_session_cookie(
    store: Store,
) -> None:
    for n in range(52):
        made(store, f"run-{n:02d}", status="finished")
    c = client(store)
    first = c.get("/")
    cookie = first.headers["set-cookie"].lower()
    assert "gfd_session=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
    assert len(rows(first.text)) == 50 and rows(first.text)[0][0] == "run-51"
    link = re.search(r'<a data-next href="([^"]+)"', first.text)
    assert link is not None
    second = c.get(link.group(1).replace("&amp;", "&"))
    assert [r for r, _ in rows(second.text)] == ["run-01", "run-00"]
    assert "data-next" not in second.text


async def test_an_answer_given_on_the_run_page_returns_to_the_run_page(store_url: str, store: Store) -> None:
    await waiting_run(store_url, "asks-1")
    c = client(store)
    request_id = store.pending_requests("asks-1")[0].request_id
    assert 'name="back" value="run"' in c.get("/runs/asks-1").text
    got = post(c, "/runs/asks-1/respond", "/runs/asks-1", text="yes", request_id=request_id, back="run")
    assert got.status_code == 200 and "Run <span" in got.text and 'data-status="interrupted"' in got.text


async def test_an_answer_with_a_nul_is_kept_and_a_form_with_invalid_utf8_is_refused_naming_its_field(
    store_url: str, store: Store
) -> None:
    await waiting_run(store_url, "asks-1")
    await waiting_run(store_url, "asks-2")
    c = client(store)
    token = csrf_of(c.get("/inbox").text)
    first = store.pending_requests("asks-1")[0].request_id
    answered = post(c, "/runs/asks-1/respond", "/inbox", text="yes\x00, refund", request_id=first)
    assert answered.status_code == 200 and "answered" in answered.text
    (asked,) = [r for r in store.requests.of_run("asks-1") if r.request_id == first]
    assert asked.answer == "yes\x00, refund"
    # Bytes a browser never sends: a lone surrogate encoded as UTF-8 (invalid UTF-8), in the answer;
    # then in a supplied output, and an answer sent as multipart (whose parser reads such bytes as
    # Latin-1). Each is refused, naming what is wrong, and nothing changes.
    second = store.pending_requests("asks-2")[0].request_id
    before = store.get_run("asks-2")
    form = {"content-type": "application/x-www-form-urlencoded"}
    body = f"csrf={token}&request_id={second}&text=ok%ED%A0%80".encode()
    got = c.post("/runs/asks-2/respond", content=body, headers=form)
    assert got.status_code == 400 and "Traceback" not in got.text
    assert "&#39;text&#39; is not valid UTF-8" in got.text and "nothing was changed" in got.text
    got = c.post("/runs/asks-2/supply", content=f"csrf={token}&node=H&text=%FF".encode(), headers=form)
    assert got.status_code == 400 and "&#39;text&#39; is not valid UTF-8" in got.text
    got = c.post(
        "/runs/asks-2/respond",
        files={"text": (None, b"ok\xff"), "csrf": (None, token), "request_id": (None, second)},
    )
    assert got.status_code == 400 and "send the form urlencoded" in got.text
    assert store.get_run("asks-2") == before
    (asked,) = [r for r in store.requests.of_run("asks-2") if r.request_id == second]
    assert asked.status == "pending" and asked.answer is None
