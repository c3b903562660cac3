"""What the command-line shells share: the Click pieces, the ``MODULE:ATTR`` importer and the
error -> exit-code path.

Every command's ``main(argv)`` runs its Click command through :func:`run_command`, which turns
whatever goes wrong into one line on stderr and the command's documented exit code: no traceback
ever reaches the user, and a usage error is one line (``prog: message (see prog --help)``, exit 2),
in the words the commands used before they moved to Click. :func:`store_option` and
:func:`json_option` declare ``--store`` and ``--json`` once for every command. A stdout its reader closed (``graphflow-durable runs verify | head -1``) takes no
more output, and the command still ends with its own exit code (4 for damage found, not 0).
:func:`prepare_streams` (each console script's first call) makes stdout and stderr write what the
terminal's encoding cannot show as backslash escapes. :func:`load_json` reads the JSON files the
commands are given, refusing nesting deeper than :data:`MAX_JSON_DEPTH`. :func:`store_codec` is
the one place every command builds the store's codec from the environment (``GRAPHFLOW_DURABLE_KEYS``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from graphflow_durable._model.codec import too_deep
from graphflow_durable.crypto import AESGCMCodec, Codec, Keys
from graphflow_durable.errors import StoreConfigError
from graphflow_durable.flow import DEFAULT_STORE_ENV
from graphflow_durable.store import Store

__all__ = [
    "ALLOW_PLAINTEXT_ENV",
    "EXIT_INTERRUPTED",
    "EXIT_PIPE",
    "MAX_JSON_DEPTH",
    "FLOAT",
    "INT",
    "KEYS_ENV",
    "STORE",
    "Choice",
    "CliError",
    "Command",
    "ExitCodes",
    "Group",
    "allow_plaintext",
    "exclusive",
    "import_attribute",
    "json_option",
    "load_json",
    "open_store",
    "prepare_streams",
    "require_value",
    "run_command",
    "store_codec",
    "store_option",
    "table",
    "write_atomically",
]

_F = TypeVar("_F", bound=Callable[..., Any])

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


#: The keys every command seals and opens the store's content with (docs/encryption.md).
KEYS_ENV = "GRAPHFLOW_DURABLE_KEYS"

#: Set to 1 (or true/yes) for the migration window: plain content rows read too (``allow_plaintext``).
ALLOW_PLAINTEXT_ENV = "GRAPHFLOW_DURABLE_ALLOW_PLAINTEXT"

#: Where :func:`store_option` keeps the ``--store`` value given (the root context's ``meta``).
STORE = "graphflow_durable.store"
#: Where the running command's name (``runs fork``) is kept for the exit-code map.
_COMMAND = "graphflow_durable.command"

#: How a command's errors end it: the exit code for an exception raised by the command named (its
#: path below the program: ``submit``, ``runs fork``), or ``None`` for an unforeseen one (exit 1).
ExitCodes = Callable[[BaseException, str], "int | None"]


class Command(click.Command):
    """A Click command whose epilog (the exit codes) is printed as written, not re-wrapped, and
    whose line in its group's list is its help's first paragraph, whole (Click cuts it at 45
    characters)."""

    def get_short_help_str(self, limit: int = 45) -> str:
        return self.short_help or (self.help or "").partition("\n\n")[0]

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.epilog:
            formatter.write("\n" + self.epilog)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Extra arguments are refused here, in argparse's words, not in Click's.
        allowed, ctx.allow_extra_args = ctx.allow_extra_args, True
        rest = _parse(super().parse_args, ctx, args)
        ctx.allow_extra_args = allowed
        if rest and not allowed:
            raise click.UsageError(f"unrecognized arguments: {' '.join(rest)}", ctx)
        return rest

    def invoke(self, ctx: click.Context) -> Any:
        ctx.find_root().meta[_COMMAND] = ctx.command_path.partition(" ")[2]
        return super().invoke(ctx)


def _parse(
    parse: Callable[[click.Context, list[str]], list[str]], ctx: click.Context, args: list[str]
) -> list[str]:
    """``parse(ctx, args)``; a usage error of Click's parser (an option without its value) learns
    the command it was given to, so that its line says which ``--help`` to see."""
    try:
        return parse(ctx, args)
    except click.UsageError as exc:
        exc.ctx = exc.ctx or ctx
        raise


class Group(click.Group):
    """A Click group whose unknown or missing sub-command is a one-line usage error; its commands
    and sub-groups are of the classes above."""

    command_class = Command
    group_class = type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["invoke_without_command"] = True
        kwargs.setdefault("subcommand_metavar", "COMMAND [ARGS]...")  # required, unlike Click's guess
        super().__init__(*args, **kwargs)
        callback = self.callback

        # Click calls the group's own callback without a sub-command too (invoke_without_command),
        # so that a missing one is refused here, in argparse's words, not with the usage block.
        def checked(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            if ctx.invoked_subcommand is None:
                raise click.UsageError("the following arguments are required: command", ctx)
            return None if callback is None else callback(*args, **kwargs)

        self.callback = checked

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        Command.format_epilog(self, ctx, formatter)  # type: ignore[arg-type]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse(super().parse_args, ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order they were added, as the epilog lists them

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            choices = ", ".join(repr(name) for name in self.commands)
            raise click.UsageError(
                f"argument command: invalid choice: {args[0]!r} (choose from {choices})", ctx
            )
        return super().resolve_command(ctx, args)


# Not subscripted: Click's types are generic only since 8.2 (Choice) and 8.3 (ParamType).
class Choice(click.Choice):  # type: ignore[type-arg]
    """One of ``choices``; anything else is refused in argparse's words (``invalid choice: 'x'``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value not in self.choices:
            choices = ", ".join(repr(choice) for choice in self.choices)
            self.fail(f"invalid choice: {value!r} (choose from {choices})", param, ctx)
        return value


class _Number(click.ParamType):  # type: ignore[type-arg]
    def __init__(self, kind: type[int] | type[float]) -> None:
        self.kind = kind
        self.name = kind.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self.kind(value)
        except ValueError:
            self.fail(f"invalid {self.name} value: {value!r}", param, ctx)


#: Numbers, refused in argparse's words (``invalid int value: 'x'``); ``FLOAT`` takes ``nan`` and
#: ``inf`` as Python does (the library's own checks refuse them where they make no sense).
INT, FLOAT = _Number(int), _Number(float)


def _keep_store(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:  # a sub-command's --store wins over the one before the sub-command
        ctx.find_root().meta[STORE] = value


def store_option(command: _F) -> _F:
    """``--store URL``: on the program and on each sub-command; the value is read with
    ``ctx.find_root().meta.get(STORE)`` (``None``: not given)."""
    return click.option(
        "--store",
        metavar="URL",
        expose_value=False,
        callback=_keep_store,
        help="database URL (sqlite:///runs.db, postgresql://...)",
    )(command)


def json_option(help: str) -> Callable[[_F], _F]:
    """``--json``: the command prints JSON (its parameter is ``json``); ``help`` says its shape."""
    return click.option("--json", "json", is_flag=True, help=help)


def exclusive(ctx: click.Context, *given: tuple[str, object]) -> None:
    """Refuse two of the mutually exclusive options ``given`` (``(flag, value)``, unset: ``None``
    or ``False``) in argparse's words: ``argument --team: not allowed with argument --graph``."""
    named = [flag for flag, value in given if value is not None and value is not False]
    if len(named) > 1:
        raise click.UsageError(f"argument {named[1]}: not allowed with argument {named[0]}", ctx)


def require_value(flag: str, value: str | None, what: str) -> str | None:
    """``value`` unless it was given empty (or white space only): that is a usage error, exit 2."""
    if value is not None and not value.strip():
        raise CliError(f"{flag} was given an empty value; give {what}", 2)
    return value


def store_codec(environ: Mapping[str, str] | None = None) -> Codec | None:
    """The codec every command opens its store with: AES-256-GCM under the keys of
    ``GRAPHFLOW_DURABLE_KEYS`` (the active one: ``GRAPHFLOW_DURABLE_ACTIVE_KEY``, else the last
    listed), or ``None`` when it is not set (a sealed row then says which key it needs).

    Raises:
        CliError: (exit 2) the variable is malformed (not ``id=base64``, not 32 bytes, an id given
            twice) or the ``crypto`` extra is missing: one line naming the key id, never its material.
    """
    env = os.environ if environ is None else environ
    if not env.get(KEYS_ENV, "").strip():
        return None
    try:
        return AESGCMCodec(Keys.from_env(env))
    except StoreConfigError as exc:
        raise CliError(str(exc), 2) from None


def allow_plaintext() -> bool:
    """Whether ``GRAPHFLOW_DURABLE_ALLOW_PLAINTEXT`` opens the migration window (plain rows read too)."""
    return os.environ.get(ALLOW_PLAINTEXT_ENV, "").strip().lower() in ("1", "true", "yes")


def open_store(url: str, *, create: bool, given: bool, migrate: bool = True) -> Store:
    """The store at ``url``, with the codec of :func:`store_codec`; unless ``create``, a URL with
    no store there is a usage error that says where the URL came from (nothing is created)."""
    codec = store_codec()
    try:
        return Store(url, create=create, migrate=migrate, codec=codec, allow_plaintext=allow_plaintext())
    except StoreConfigError as exc:
        if exc.option != "create":
            raise
        if given:
            hint = "check --store"
        elif os.environ.get(DEFAULT_STORE_ENV):
            hint = f"check {DEFAULT_STORE_ENV}"
        else:
            hint = f"give --store or set {DEFAULT_STORE_ENV}"
        raise CliError(f"{exc}; {hint}", 2) from None


def run_command(
    prog: str,
    command: click.Command,
    argv: Sequence[str] | None,
    *,
    codes: ExitCodes = lambda _exc, _command: None,
    usage_code: int = 2,
) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) for ``command`` and run it; its exit code. Every
    failure becomes ``prog: message`` on stderr:

    - ``--help``: 0; a usage error (Click's): one line, ``usage_code``;
    - :class:`CliError`: its message and code;
    - an exception ``codes`` gives a code for: its message and that code;
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
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _run(prog, command, args, codes, usage_code)
        guard.flush()  # what is still buffered is delivered (or found unwanted) here, not at exit
        return code
    finally:
        if sys.stdout is guard:
            sys.stdout = stdout


def _run(prog: str, command: click.Command, args: list[str], codes: ExitCodes, usage_code: int) -> int:
    meta: dict[str, Any] = {}
    try:
        # Not command.main(): it would turn Ctrl-C into Click's "Aborted!" and print usage blocks.
        with command.make_context(prog, args) as ctx:
            meta = ctx.meta
            code = command.invoke(ctx)
            return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:  # --help
        return exc.exit_code
    except click.ClickException as exc:
        _say(prog, _usage_message(exc))
        return usage_code
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
        code = codes(exc, meta.get(_COMMAND, ""))
        if code is not None:
            _say(prog, str(exc))
            return code
        _log.debug("%s failed", prog, exc_info=True)
        _say(prog, f"unexpected error: {type(exc).__name__}: {exc}")
        return _EXIT_UNEXPECTED


def _usage_message(exc: click.ClickException) -> str:
    """A usage error on one line, in the words argparse used: ``argument --n: invalid int value:
    'x' (see graphflow-durable worker --help)``."""
    message = " ".join(exc.format_message().split())
    if isinstance(exc, click.NoSuchOption):
        message = f"unrecognized arguments: {exc.option_name}"
    elif isinstance(exc, click.BadOptionUsage) and "requires" in exc.message:
        message = f"argument {exc.option_name}: expected one argument"
    elif isinstance(exc, click.MissingParameter) and exc.param is not None:
        message = f"the following arguments are required: {_name(exc.param)}"
    elif isinstance(exc, click.BadParameter) and exc.param is not None:
        message = f"argument {_name(exc.param)}: {' '.join(exc.message.split())}"
    ctx = getattr(exc, "ctx", None)
    return message if ctx is None else f"{message} (see {ctx.command_path} --help)"


def _name(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return "/".join(param.opts)
    return param.human_readable_name


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

    @property
    def reader_gone(self) -> bool:
        """Whether the reader closed the pipe (a command that would print on and on stops then)."""
        return self._closed_by_reader

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


def table(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]]) -> list[str]:
    """A table's lines, its header first. ``columns``: each heading and its least width (negative:
    aligned right). Each column is as wide as its widest cell, so a long value (a run id) widens
    its column instead of shifting the ones after it; a last column aligned left is not padded."""
    rows = list(rows)
    widths = [max(abs(w), len(h), *(len(r[i]) for r in rows)) for i, (h, w) in enumerate(columns)]
    last = len(columns) - 1

    def line(cells: Sequence[str]) -> str:
        return " ".join(
            cell if i == last and w >= 0 else cell.rjust(widths[i]) if w < 0 else cell.ljust(widths[i])
            for i, (cell, (_, w)) in enumerate(zip(cells, columns, strict=True))
        )

    return [line([h for h, _ in columns]), *(line(r) for r in rows)]
