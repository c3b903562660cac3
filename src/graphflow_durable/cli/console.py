"""``graphflow-durable ui``: the run console (:func:`graphflow_durable.ui.create_app`) served by
uvicorn, for :mod:`.runs`.

It binds its socket itself (a port taken is one line, exit 1), prints ``graphflow-durable ui:
http://HOST:PORT/`` as the first line on stdout once it accepts connections (``--port 0``: the port
the system picked), and exits 0 on SIGINT or SIGTERM (a second signal stops open streams at once).
A host other than loopback needs a token (``--token`` or :data:`TOKEN_ENV`) unless
``--insecure-no-auth`` says otherwise: the console shows prompts and answers and acts on runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from types import FrameType, SimpleNamespace
from typing import Any

import click

from graphflow_durable.cli._common import INT, CliError, store_option
from graphflow_durable.store import Store

__all__ = ["EPILOG", "TOKEN_ENV", "add_command", "check", "serve"]

logger = logging.getLogger(__name__)

#: Where the console's token may come from instead of ``--token`` (kept out of ``ps``).
TOKEN_ENV = "GRAPHFLOW_DURABLE_UI_TOKEN"

#: What the extra is called, for the one line that says it is missing.
_INSTALL = "pip install 'graphflow-durable[ui]'"

EPILOG = """\
  ui [--host 127.0.0.1] [--port 8765] [--read-only] [--token TOKEN] [--insecure-no-auth]
                                     the run console in the browser: runs, the inbox of requests
                                     for human input, a run's graph, timeline and transcript live,
                                     actions; a host other than loopback needs a token (--token or
                                     GRAPHFLOW_DURABLE_UI_TOKEN); docs/console.md
"""


def add_command(cli: click.Group, dispatch: Callable[[str, dict[str, Any]], int]) -> None:
    """Add ``ui`` to the program's group; it runs through ``dispatch``."""

    @cli.command("ui", help="serve the run console in the browser (pip install 'graphflow-durable[ui]')")
    @store_option
    @click.option("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    @click.option("--port", type=INT, default=8765, help="port (default 8765; 0: any free port)")
    @click.option("--read-only", is_flag=True, help="show no action; refuse every POST")
    @click.option("--token", default=None, help=f"the token the console asks for (or {TOKEN_ENV})")
    @click.option("--insecure-no-auth", is_flag=True, help="serve a non-loopback host without a token")
    def _ui(**params: Any) -> int:
        return dispatch("ui", params)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check(args: SimpleNamespace) -> str | None:
    """Refuse bad options before the store is opened (exit 2; the extra missing: exit 1); the token
    (``--token``, else :data:`TOKEN_ENV`, else ``None``)."""
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        raise CliError("--token was given an empty value; give the token the console asks for", 2)
    if not 0 <= args.port <= 65535:
        raise CliError(f"argument --port: {args.port} is not a port; give 0 to 65535", 2)
    if token is None and not args.insecure_no_auth and not _loopback(args.host):
        raise CliError(
            f"--host {args.host} is not a loopback address and the console has no token: give one with "
            f"--token TOKEN or {TOKEN_ENV}=TOKEN (or --insecure-no-auth to serve it to anyone)",
            2,
        )
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise CliError(f"the console needs its extra ({exc.name} is missing): {_INSTALL}", 1) from None
    return token


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening (a port taken: one line, exit 1)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CliError(f"--host {host}: cannot listen there ({exc.strerror or exc})", 1) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1) from None
    sock.setblocking(False)
    return sock


def serve(store: Store, args: SimpleNamespace, token: str | None, out: Callable[[str], None]) -> int:
    """Serve the console over ``store`` until SIGINT or SIGTERM; exit code 0."""
    import uvicorn

    from graphflow_durable.ui import create_app

    app = create_app(store, read_only=args.read_only, token=token)
    sock = _listen(args.host, args.port)
    port = sock.getsockname()[1]
    host = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own re-raises the signal once stopped (killed: exit 143); ours exits 0.
            def stop(signum: int, frame: FrameType | None) -> None:
                if self.should_exit:
                    self.force_exit = True
                self.should_exit = True

            old = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for signum in old:
                    signal.signal(signum, signal.SIG_IGN)  # stopping: a late signal changes nothing

    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=2,
    )
    server = Server(config)

    async def run() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            out(f"graphflow-durable ui: http://{host}:{port}/")
            logger.info("console on http://%s:%s/ over %s", host, port, store.url)
        await task

    try:
        asyncio.run(run())
    finally:
        sock.close()
    return 0
