"""The console's routes: the pages (server-rendered, Jinja2 with autoescape on), the actions (form
POSTs through the Store calls the CLI uses), the JSON API and the export; :func:`build` assembles
them with the guard (``guard.py``) and the live events (``live.py``).

Every store call runs in a worker thread (Starlette runs a plain ``def`` endpoint in its thread
pool; the async endpoints use ``run_in_threadpool``): a slow database never blocks the event loop.
The library's errors become pages (or JSON under ``/api/``): an unknown run 404, a bad value 400,
a refusal by the run's state 409 with the CLI's words, content sealed under a key the console was
not started with 403 naming the key (never the stored ciphertext), the database down 503 with one
line.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus, unquote_to_bytes

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from graphflow_durable._model.records import NodeFailure
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage.lease import iso
from graphflow_durable.errors import (
    ConflictError,
    GraphflowDurableError,
    NotWaitingError,
    RunLockedError,
    RunNotFoundError,
    RunStateError,
    StoreConfigError,
    StoreCorruptError,
    StoreError,
    UsageError,
)
from graphflow_durable.store import RUN_STATUSES, Store
from graphflow_durable.ui import live
from graphflow_durable.ui.guard import AUTH_COOKIE, Guard, Secrets, json_error, session_of
from graphflow_durable.ui.live import message_view, pictures
from graphflow_durable.views import list_row, list_rows, message_json, run_show, submitted_show

__all__ = ["build"]

logger = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
#: Runs per page of the runs list.
PAGE = 50
#: The actions on a run's page, in the order shown.
ACTIONS = ("cancel", "retry", "supply", "fork", "delete")


def _refusal_status(exc: BaseException) -> int:
    """The HTTP status of a library error."""
    if isinstance(exc, RunNotFoundError):
        return 404
    if isinstance(exc, StoreConfigError):  # a sealed row under a key this console was not given
        return 403
    if isinstance(exc, (RunStateError, RunLockedError, NotWaitingError, ConflictError)):
        return 409
    if isinstance(exc, UsageError):
        return 400
    if isinstance(exc, StoreCorruptError):
        return 500
    if isinstance(exc, StoreError):
        return 503  # the database is down or refuses: the same call may succeed later
    return 500


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class Console:
    """The routes over one store."""

    def __init__(self, store: Store, *, read_only: bool, keys: Secrets) -> None:
        self.store = store
        self.read_only = read_only
        self.keys = keys
        self.env = Environment(
            loader=FileSystemLoader(str(_HERE / "templates")),
            autoescape=select_autoescape(default=True, default_for_string=True),
            auto_reload=False,
        )
        self.env.filters["iso"] = lambda t: "-" if t is None else iso(t)
        self.env.globals["statuses"] = RUN_STATUSES

    # Rendering.

    def render(self, request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "") or ""
        context.setdefault("notice", None)
        context.setdefault("error", None)
        html = self.env.get_template(name).render(
            base=base,
            csrf=self.keys.csrf(session_of(request)),
            read_only=self.read_only,
            token=self.keys.token is not None,
            **context,
        )
        return HTMLResponse(html, status_code=code)

    def refuse(self, request: Request, status: int, why: str) -> Response:
        """A refusal before any route: JSON under ``/api/``, else a page (401: the login form)."""
        if _is_api(request):
            return Response(json_error(status, why), status_code=status, media_type="application/json")
        if status == 401:
            root = request.scope.get("root_path", "") or ""
            return self.render(request, "login.html", status, next=_next(request.url.path.removeprefix(root)))
        return self.render(request, "error.html", status, status=status, message=why)

    def failed(self, request: Request, exc: Exception) -> Response:
        """A library error (or an HTTP one) as a page or JSON, one line."""
        if isinstance(exc, HTTPException):
            status, message = exc.status_code, str(exc.detail)
        else:
            status = _refusal_status(exc)
            message = one_line(str(exc)) if isinstance(exc, GraphflowDurableError) else "internal error"
            if status == 503:
                message = f"the database is unavailable: {message}; the console retries on each request"
            if status >= 500:
                logger.warning("console: %s %s: %s", request.method, request.url.path, message)
        if _is_api(request):
            return Response(json_error(status, message), status_code=status, media_type="application/json")
        return self.render(request, "error.html", status, status=status, message=message)

    # Pages.

    def runs_page(self, request: Request) -> Response:
        status, text, after = _filters(request)
        found = self.store.list_runs_page(
            status=None if status is None else [status], text=text or None, after=after, limit=PAGE
        )
        counts = self.store.run_counts()
        now = self.store.lease_clock()
        rows = []
        for run in found.runs:
            row = list_row(run, found.submissions.get(run.run_id), found.pending.get(run.run_id, []), now)
            row["round"] = found.rounds.get(run.run_id, 0)
            row["parent_run_id"] = run.parent_run_id
            row["updated_at"] = run.updated_at
            failure = NodeFailure.of(run)  # as runs show: the node's error when no worker recorded one
            if failure is not None and row["last_error"] is None:
                row["last_error"] = f"{failure.error_type}: {failure.error}"
            asked = {r["node"] for r in row["pending"]}
            row["now"] = ", ".join(sorted(asked | set(found.in_flight.get(run.run_id, []))))
            rows.append(row)
        return self.render(
            request,
            "runs.html",
            rows=rows,
            counts=counts,
            total=sum(counts.values()),
            status=status,
            q=text,
            next=found.next,
        )

    def inbox_page(self, request: Request, status: int = 200, **context: Any) -> Response:
        requests = self.store.open_requests()
        return self.render(request, "inbox.html", status, requests=requests, **context)

    def run_page(self, request: Request, status: int = 200, **context: Any) -> Response:
        run_id = _run_id(request)
        run = self.store.get_run(run_id)
        if run is None:
            sub = self.store.queue.get_submission(run_id)
            if sub is None:
                raise RunNotFoundError(f"run {run_id} does not exist", run_id=run_id)
            shown = submitted_show(self.store, sub, self.store.lease_clock())
            return self.render(request, "submitted.html", status, shown=shown, **context)
        seen = run_show(self.store, run)
        messages = [message_view(m) for m in self.store.transcript(run_id)]
        calls = self.store.call_history(run_id)
        nested = self.store.list_runs_page(parent=run_id, limit=100).runs
        return self.render(
            request,
            "run.html",
            status,
            run=run,
            shown=seen.fields,
            failure=seen.failure,
            requests=seen.requests,
            messages=messages,
            calls=calls,
            nested=nested,
            pictures=pictures(self.store, run_id),
            actions=ACTIONS,
            last_seq=messages[-1]["seq"] if messages else -1,
            **context,
        )

    def stats_page(self, request: Request) -> Response:
        stats = self.store.stats()
        depth = self.store.queue.depth()
        return self.render(request, "stats.html", stats=stats, depth=depth)

    # Actions (POST, CSRF-checked).

    async def form(self, request: Request) -> dict[str, str]:
        """The POST's form fields, once its CSRF token was checked (403 otherwise) and every field
        found valid UTF-8 (400 naming the field otherwise: never stored replaced or mangled)."""
        multipart = request.headers.get("content-type", "").startswith("multipart/")
        bad = None if multipart else _not_utf8(await request.body())
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if not self.keys.csrf_ok(session_of(request), fields.get("csrf")):
            raise HTTPException(403, "refused: the form's CSRF token is missing or wrong; reload the page")
        if multipart:  # its parser reads bytes that are not UTF-8 as Latin-1: refused, not guessed
            raise UsageError(
                "refused: send the form urlencoded, as the console's pages do; nothing was changed"
            )
        if bad is not None:
            raise UsageError(
                f"refused: the form's field {bad!r} is not valid UTF-8 text; nothing was changed: send it as UTF-8",
                option=bad,
            )
        return fields

    async def respond(self, request: Request) -> Response:
        fields = await self.form(request)
        run_id = _run_id(request)
        text, request_id = fields.get("text"), fields.get("request_id") or None
        back = self.run_page if fields.get("back") == "run" else self.inbox_page  # the page it came from
        if text is None or not text.strip():
            return await run_in_threadpool(
                back, request, 400, error="an answer is needed: write it in the box"
            )
        try:
            done = await run_in_threadpool(self.store.respond, run_id, text, request_id=request_id)
        except NotWaitingError as exc:  # answered first by someone else, or not waiting any more
            return await run_in_threadpool(back, request, 409, error=one_line(str(exc)))
        run = await run_in_threadpool(self.store.get_run, run_id)
        now = "" if run is None else f"; the run is {run.status}"
        notice = f"{run_id}: answered {done.request_id} ({done.node}){now}"
        return await run_in_threadpool(back, request, 200, notice=notice)

    async def action(self, request: Request) -> Response:
        fields = await self.form(request)
        run_id = _run_id(request)
        name = request.url.path.rsplit("/", 1)[-1]
        try:
            notice, link = await run_in_threadpool(self._act, name, run_id, fields)
        except (RunStateError, RunLockedError, ConflictError, NotWaitingError) as exc:
            return await run_in_threadpool(self.run_page, request, 409, error=one_line(str(exc)))
        except UsageError as exc:
            if isinstance(exc, RunNotFoundError):
                raise
            return await run_in_threadpool(self.run_page, request, 400, error=one_line(str(exc)))
        if name == "delete":
            return self.render(request, "deleted.html", notice=notice)
        return await run_in_threadpool(self.run_page, request, 200, notice=notice, link=link)

    def _act(self, name: str, run_id: str, fields: dict[str, str]) -> tuple[str, str | None]:
        store = self.store
        if name == "cancel":
            c = store.cancel_run(run_id)
            words = {
                "requested": f"cancel requested; its driver {c.owner} stops before its next dispatch",
                "cancelled": "cancelled (nobody was driving it); run() with no task resumes it",
            }.get(c.outcome, "already cancelled")
            return f"run {run_id}: {words}", None
        if name == "retry":
            r = store.retry_run(run_id)
            was = "submitted, not started" if r.previous_status is None else r.previous_status
            return f"run {run_id}: queued again, {r.status or 'submitted'} (was {was})", None
        if name == "supply":
            node, text = fields.get("node", ""), fields.get("text", "")
            s = store.supply_output(run_id, node, text)
            return f"run {run_id}: node {s.node}'s answer supplied (step {s.step}); {s.status}", None
        if name == "fork":
            step = _int(fields.get("step"), "step")
            run = store.fork(run_id, step)
            return f"forked run {run_id} at step {step} as run {run.run_id}: {run.status}", run.run_id
        gone = store.delete_run(run_id)
        nested = f" and {len(gone.run_ids) - 1} nested runs" if len(gone.run_ids) > 1 else ""
        return f"run {run_id}{nested}: deleted", None

    def export(self, request: Request) -> Response:
        run_id = _run_id(request)
        document = self.store.export_run(run_id)
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:100] or "run"
        return Response(
            json.dumps(document, sort_keys=True),
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="{safe}.json"'},
        )

    # Login.

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, "login.html", next=_next(request.query_params.get("next")))
        form = await request.form()
        given, target = form.get("token"), _next(str(form.get("next") or ""))
        if not self.keys.csrf_ok(session_of(request), form.get("csrf")):
            return self.render(
                request, "login.html", 403, error="reload the page and log in again", next=target
            )
        if self.keys.token is None or not isinstance(given, str) or not self.keys.token_matches(given):
            return self.render(request, "login.html", 401, error="wrong token", next=target)
        base = request.scope.get("root_path", "") or ""
        response = RedirectResponse(base + target, status_code=303)
        response.set_cookie(
            AUTH_COOKIE,
            self.keys.login_cookie(),
            path=base or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    # The JSON API.

    def api_runs(self, request: Request) -> Response:
        status, text, after = _filters(request, submitted=True)
        if status == "submitted":
            return JSONResponse({"runs": list_rows(self.store, {"submitted"}), "next": None})
        limit = _int(request.query_params.get("limit", str(PAGE)), "limit")
        found = self.store.list_runs_page(
            status=None if status is None else [status], text=text or None, after=after, limit=limit
        )
        now = self.store.lease_clock()
        rows = [
            list_row(run, found.submissions.get(run.run_id), found.pending.get(run.run_id, []), now)
            for run in found.runs
        ]
        return JSONResponse({"runs": rows, "next": found.next})

    def api_run(self, request: Request) -> Response:
        run_id = _run_id(request)
        run = self.store.get_run(run_id)
        if run is None:
            sub = self.store.queue.get_submission(run_id)
            if sub is None:
                raise RunNotFoundError(f"run {run_id} does not exist", run_id=run_id)
            return JSONResponse(submitted_show(self.store, sub, self.store.lease_clock()))
        return JSONResponse(run_show(self.store, run).fields)

    def api_history(self, request: Request) -> Response:
        return JSONResponse([s.as_dict() for s in self.store.history(_run_id(request))])

    def api_transcript(self, request: Request) -> Response:
        return JSONResponse([message_json(m) for m in self.store.transcript(_run_id(request))])

    def api_calls(self, request: Request) -> Response:
        return JSONResponse([r.as_dict() for r in self.store.call_history(_run_id(request))])

    def api_inbox(self, request: Request) -> Response:
        return JSONResponse([{"run_id": r.run_id, **r.to_json()} for r in self.store.open_requests()])

    def api_stats(self, request: Request) -> Response:
        return JSONResponse({**self.store.stats().as_dict(), "queue_depth": self.store.queue.depth()})


def _is_api(request: Request) -> bool:
    root = request.scope.get("root_path", "") or ""
    path = request.url.path
    return path.removeprefix(root).startswith("/api/")


def _run_id(request: Request) -> str:
    return check_run_id(request.path_params["run_id"], option="run id")


def _not_utf8(body: bytes) -> str | None:
    """The name of the first field of an urlencoded form whose name or value is not valid UTF-8
    once unquoted (``None``: all are)."""
    for pair in body.split(b"&"):
        name, _, value = pair.partition(b"=")
        for part in (name, value):
            try:
                unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")
            except UnicodeDecodeError:
                return unquote_plus(name.decode("latin-1"), errors="replace")
    return None


def _int(value: str | None, name: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise UsageError(f"{name}={value!r} is not a whole number", option=name) from None


def _filters(request: Request, *, submitted: bool = False) -> tuple[str | None, str, str | None]:
    """The list's ``status=``, ``q=`` and ``after=`` query values (an unknown status: 400)."""
    query = request.query_params
    status = query.get("status") or None
    allowed = (*RUN_STATUSES, "submitted") if submitted else RUN_STATUSES
    if status is not None and status not in allowed:
        raise UsageError(f"status={status!r} is not a run status; give one of {', '.join(allowed)}")
    text = query.get("q", "").strip()
    if len(text) > 500 or not text.isprintable():
        raise UsageError("q= must be printable text of at most 500 characters", option="q")
    return status, text, query.get("after") or None


def _next(target: str | None) -> str:
    """Where a login goes on: a path of the console only (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def build(store: Store, *, read_only: bool = False, token: str | None = None) -> Starlette:
    """The console app (see :func:`graphflow_durable.ui.create_app`)."""
    if token is not None and not token.strip():
        raise UsageError("the console's token is empty; give a non-empty token or none", option="token")
    keys = Secrets(token)
    c = Console(store, read_only=read_only, keys=keys)

    def page(method: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:  # a plain def: Starlette runs it in a thread
            return method(request)

        return endpoint

    followers = live.Followers(store)
    actions = [Route(f"/runs/{{run_id:path}}/{name}", c.action, methods=["POST"]) for name in ACTIONS]
    routes = [
        Route("/", page(c.runs_page)),
        Route("/inbox", page(c.inbox_page)),
        Route("/stats", page(c.stats_page)),
        Route("/login", c.login, methods=["GET", "POST"]),
        Route("/api/runs", page(c.api_runs)),
        Route("/api/inbox", page(c.api_inbox)),
        Route("/api/stats", page(c.api_stats)),
        Route("/api/runs/{run_id:path}/history", page(c.api_history)),
        Route("/api/runs/{run_id:path}/transcript", page(c.api_transcript)),
        Route("/api/runs/{run_id:path}/calls", page(c.api_calls)),
        Route("/api/runs/{run_id:path}", page(c.api_run)),
        Route("/runs/{run_id:path}/respond", c.respond, methods=["POST"]),
        *actions,
        Route("/runs/{run_id:path}/export", page(c.export)),
        Route("/runs/{run_id:path}/events", followers.endpoint),
        Route("/runs/{run_id:path}", page(c.run_page)),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]

    async def handle(request: Request, exc: Exception) -> Response:
        return await run_in_threadpool(c.failed, request, exc)

    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: handle, GraphflowDurableError: handle, Exception: handle},
    )
    app.add_middleware(Guard, keys=keys, read_only=read_only, refuse=c.refuse)
    app.state.console = c
    app.state.followers = followers
    return app
