"""The run console in the browser: ``graphflow-durable ui`` and :func:`create_app` (extra ``ui``).

Importing this package needs nothing beyond the library; :func:`create_app` imports Starlette and
Jinja2 (``pip install 'graphflow-durable[ui]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from graphflow_durable.store import Store

__all__ = ["create_app"]


def create_app(store: Store, *, read_only: bool = False, token: str | None = None) -> Starlette:
    """The run console as an ASGI application (Starlette) over ``store``.

    Serve it with any ASGI server (``uvicorn``), or mount it in your own app:
    ``app.mount("/console", create_app(store, token=...))`` (FastAPI or Starlette); its links and
    cookies follow the mount path. The pages: ``/`` (runs), ``/inbox`` (open requests for human
    input), ``/runs/{run_id}`` (a run: its header, graph, timeline, transcript, calls and actions),
    ``/stats``; the JSON API under ``/api/``; live updates at ``/runs/{run_id}/events`` (Server-Sent
    Events). See docs/console.md.

    Args:
        store: the store to show. The console reads it and writes only through the calls the CLI
            uses (respond, cancel, retry, supply, fork, delete); it never takes a lease.
        read_only: show no action, refuse every POST (403).
        token: when given, every request needs it: a login page (``/login``) sets an HttpOnly,
            SameSite=Strict cookie, and the API takes ``Authorization: Bearer TOKEN``; without it,
            pages answer 401 with the login form and the API a JSON 401.

    Raises:
        ImportError: the ``ui`` extra is not installed.
    """
    from graphflow_durable.ui.app import build

    return build(store, read_only=read_only, token=token)
