"""What the command-line shells share: the ``MODULE:ATTR`` importer and the error -> exit-code path.

Every command's ``main(argv)`` runs its body through :func:`run_command`, which turns whatever
goes wrong into one line on stderr and the command's documented exit code: no traceback ever
reaches the user. A stdout its reader closed (``graphflow-durable runs verify | head -1``) takes no
more output, and the command still ends with its own exit code (4 for damage found, not 0).
:func:`prepare_streams` (each console script's first call) makes stdout and stderr write what the
terminal's encoding cannot show as backslash escapes. :func:`load_json` reads the JSON files the
commands are given, refusing nesting deeper than :data:`MAX_JSON_DEPTH`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from graphflow_durable._model.codec import too_deep

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_PIPE",
    "MAX_JSON_DEPTH",
    "CliError",
    "OneLineParser",
    "import_attribute",
    "load_json",
    "prepare_streams",
    "require_value",
    "run_command",
    "write_atomically",
]

_log = logging.getLogger(__name__)

#: Ctrl-C outside the worker's own signal handling (the shell's convention: 128 + SIGINT).
EXIT_INTERRUPTED = 130
#: A write to a closed pipe that escaped the stdout guard (the shell's convention: 128 + SIGPIPE).
EXIT_PIPE = 141
#: How deeply a JSON file given to a command may nest. A team state or a run export nests about 15
#: levels; far deeper input would exhaust the stack of the code that reads it (Python's JSON parser
#: gives up near 1,000 levels, the repair engine and the indenting JSON writer sooner).
MAX_JSON_DEPTH = 200
#: An error nobody foresaw (a bug): one line on stderr, the traceback only in the debug log.
_EXIT_UNEXPECTED = 1


class CliError(Exception):
    """A one-line error for stderr, with the exit code the command documents for it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``prog: message (see --help)``), exit 2.

    Its sub-command parsers are of the same class, so they report the same way.
    """

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)", 2)


def require_value(flag: str, value: str | None, what: str) -> str | None:
    """``value`` unless it was given empty (or white space only): that is a usage error, exit 2."""
    if value is not None and not value.strip():
        raise CliError(f"{flag} was given an empty value; give {what}", 2)
    return value


def run_command(
    prog: str,
    command: Callable[[], int],
    *,
    codes: Sequence[tuple[type[BaseException], int]] = (),
    usage_code: int = 2,
) -> int:
    """Run ``command`` and return its exit code; every failure becomes ``prog: message`` on stderr.

    - argparse's exit (``--help``: 0, a usage error: ``usage_code``) is returned as it is;
    - :class:`CliError`: its message and code;
    - an exception matching ``codes`` (the first ``(class, code)`` pair that matches, so list
      subclasses first): its message and that code;
    - a stdout closed by its reader: the rest of the output is dropped, the command runs to its
      end and its own exit code is returned (``runs verify | head -1`` still exits 4 when it found
      damage; a reader that had what it wanted is no failure, a command's finding is no success);
      a ``BrokenPipeError`` from anything else: :data:`EXIT_PIPE`, quietly;
    - Ctrl-C: :data:`EXIT_INTERRUPTED`; anything else: one line naming the error, exit 1 (the
      traceback is logged at DEBUG).
    """
    stdout = sys.stdout
    guard = _ReaderMayClose(stdout)
    sys.stdout = guard
    try:
        code = _run(prog, command, codes, usage_code)
        guard.flush()  # what is still buffered is delivered (or found unwanted) here, not at exit
        return code
    finally:
        if sys.stdout is guard:
            sys.stdout = stdout


def _run(
    prog: str, command: Callable[[], int], codes: Sequence[tuple[type[BaseException], int]], usage_code: int
) -> int:
    try:
        return command()
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else usage_code
    except CliError as exc:
        _say(prog, str(exc))
        return exc.code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        _say(prog, "interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 -- the one place where any error becomes an exit code
        for kind, code in codes:
            if isinstance(exc, kind):
                _say(prog, str(exc))
                return code
        _log.debug("%s failed", prog, exc_info=True)
        _say(prog, f"unexpected error: {type(exc).__name__}: {exc}")
        return _EXIT_UNEXPECTED


def prepare_streams() -> None:
    """Make stdout and stderr write a character their encoding cannot hold as a backslash escape
    (``\\u20ac``), where they would raise ``UnicodeEncodeError`` half-way through a table (an
    ISO-8859-1 or ASCII terminal, ``PYTHONIOENCODING=latin-1``, ``LC_ALL=C`` without UTF-8 mode,
    where Python writes with ``surrogateescape``). Another error handler the user chose
    (``PYTHONIOENCODING=utf-8:replace``) is kept. Called once, by each console script's entry point."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) in ("strict", "surrogateescape"):
            reconfigure(errors="backslashreplace")


class _ReaderMayClose:
    """stdout for the time of a command: once its reader closed the pipe (``| head -1``), writing
    drops the text instead of raising, so the command runs to its end and keeps its exit code."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._closed_by_reader = False

    def write(self, text: str) -> int:
        if not self._closed_by_reader:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self._closed_by_reader:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self._closed_by_reader = True
        _silence_stdout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def import_attribute(spec: str, *, flag: str, example: str, code: int, usage_code: int = 2) -> Any:
    """The object ``spec`` (``module:attribute``, the attribute possibly dotted) names.

    The working directory is importable, as with ``python -m``. Raises :class:`CliError`: with
    ``usage_code`` when ``spec`` is not of the form ``module:attribute``; with ``code`` when the
    module cannot be imported (or raises while importing) or has no such attribute.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CliError(f"{flag} {spec!r}: expected MODULE:ATTRIBUTE, e.g. {example}", usage_code)
    cwd = str(Path.cwd())
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"{flag} {spec!r}: cannot import {module_name!r}: {exc}", code) from None
    except Exception as exc:  # noqa: BLE001 -- the user's module: report it on one line
        raise CliError(
            f"{flag} {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}", code
        ) from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"{flag} {spec!r}: {module_name!r} has no attribute {attribute!r}", code) from None
    return obj


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory, synced, and a
    rename: ``path`` is the whole new text or, on any error, as it was (a full disk included).

    Raises:
        OSError: the temporary file could not be made, written or renamed (it is removed).
    """
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def load_json(text: str, *, where: str, what: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``text`` parsed as JSON, refusing nesting deeper than ``limit`` levels.

    Raises:
        CliError: (exit 2) ``where: JSON nested more than LIMIT levels deep (the limit); not a WHAT
            file``, for text the parser cannot nest that deep and for a value that nests deeper.
        json.JSONDecodeError: ``text`` is not JSON (each command says so in its own words).
    """
    refused = CliError(
        f"{where}: JSON nested more than {limit} levels deep (the limit); not a {what} file", 2
    )
    try:
        value = json.loads(text)
    except RecursionError:  # the parser's own limit, near 1,000 levels
        raise refused from None
    if too_deep(value, limit) is not None:
        raise refused
    return value


def _say(prog: str, message: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr closed too: nothing left to tell
        sys.stderr.write(f"{prog}: {message}\n")
        sys.stderr.flush()


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail again on exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
