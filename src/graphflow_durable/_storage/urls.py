"""Store URLs: the package's options in the query, the driver's options, and the URL to write back.

A store URL is a SQLAlchemy URL. Its query may hold two kinds of options:

- the package's own (SQLite ``synchronous`` and ``timeout``, PostgreSQL ``pool_pre_ping``,
  ``statement_timeout`` and ``lock_timeout``, both ``shared``): read into a pydantic model per
  backend (``_SqliteOptions``, ``_PgOptions``: one field per option, validated in field order) and
  removed from the URL before the engine is made;
- the driver's: SQLite ``cached_statements`` (the one pysqlite option SQLAlchemy reads from the
  query that does not fight the engine set-up in ``_engine``), PostgreSQL any libpq connection
  parameter (``connect_timeout``, ``sslmode``, ``application_name``, ``options``, ``host``...), which
  SQLAlchemy's psycopg dialect passes to ``psycopg.connect`` as they are.

Anything else is refused with :class:`StoreConfigError`, naming the option and the valid ones.

PostgreSQL connections get defaults that turn a network partition into an error within seconds
(:data:`PG_NETWORK_DEFAULTS`: ``connect_timeout``, TCP keepalives, ``tcp_user_timeout``), each
passed to the driver by the engine when the URL does not give it (never written into a URL).
:func:`parse_store_url` also builds the *config URL*: the URL to write into a component config,
with the package options that differ from their defaults and without any password.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, NamedTuple, TypeVar, cast

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, ValidationInfo
from pydantic import model_validator as _model_validator
from sqlalchemy.engine import URL

from graphflow_durable.errors import StoreConfigError

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_STATEMENT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "PG_NETWORK_DEFAULTS",
    "SECRET_KEYS",
    "StoreUrl",
    "libpq_keywords",
    "parse_store_url",
    "safe_url",
]

SYNCHRONOUS_MODES = ("FULL", "NORMAL", "OFF", "EXTRA")
DEFAULT_SYNCHRONOUS = "FULL"
DEFAULT_TIMEOUT = 30.0
DEFAULT_POOL_PRE_PING = True
DEFAULT_SHARED = False
#: PostgreSQL ``statement_timeout`` / ``lock_timeout`` set on each connection (seconds; 0: none).
DEFAULT_STATEMENT_TIMEOUT = 15.0
DEFAULT_LOCK_TIMEOUT = 10.0
#: libpq parameters added to a PostgreSQL URL that does not give them: a partition (packets dropped)
#: becomes a connection error instead of a hang. ``connect_timeout``: seconds for a new connection;
#: keepalives: an idle connection whose peer is gone is dropped after 5 + 3 * 2 s;
#: ``tcp_user_timeout`` (ms, Linux): sent data unacknowledged for 10 s drops the connection (the
#: case keepalives miss: a query sent into a partition).
PG_NETWORK_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}

#: libpq parameters holding secrets: hidden in messages, never written into a config URL.
SECRET_KEYS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)

#: pysqlite options SQLAlchemy would read from the query, refused because they break the engine set-up.
_SQLITE_REFUSED = {
    "uri": "SQLite URI filenames are not supported; give a plain path (sqlite:///path/to/runs.db)",
    "isolation_level": "the store runs SQLite's transactions itself (BEGIN, BEGIN IMMEDIATE for writers)",
    "check_same_thread": "the store sets it to false itself (a store is shared between threads)",
    "detect_types": "it would change the values the store reads back",
}
#: Server settings the store sets itself, refused inside libpq ``options`` (one place to give them).
_PG_SETTINGS = re.compile(r"(statement|lock)[_-]timeout", re.IGNORECASE)
_T = TypeVar("_T")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
#: The package options' defaults (an option also given as a keyword argument is merged with it).
_DEFAULTS: dict[str, Any] = {
    "synchronous": DEFAULT_SYNCHRONOUS,
    "timeout": DEFAULT_TIMEOUT,
    "shared": DEFAULT_SHARED,
    "pool_pre_ping": DEFAULT_POOL_PRE_PING,
    "statement_timeout": DEFAULT_STATEMENT_TIMEOUT,
    "lock_timeout": DEFAULT_LOCK_TIMEOUT,
}


class _Context(NamedTuple):
    """What the options' validators are given besides the query's text."""

    url: str  # the store URL, password hidden: named in every message
    arguments: Mapping[str, Any]  # parse_store_url's keyword arguments (None: not given)


def _context(info: ValidationInfo) -> _Context:
    return cast(_Context, info.context)  # _Options.read is the only way in


def _option(parse: Callable[[str, str, str], _T]) -> PlainValidator:
    """Validate an option's text with ``parse(value, name, url)``, merged with the keyword argument
    of the same name, else its default (see :data:`_DEFAULTS`)."""

    def validate(value: str | None, info: ValidationInfo) -> _T:
        context = _context(info)
        name = str(info.field_name)
        from_url = None if value is None else parse(value, name, context.url)
        merged: _T = _merge(name, context.arguments.get(name), from_url, _DEFAULTS[name], context.url)
        return merged

    return PlainValidator(validate)


def _checked(parse: Callable[[str, str, str], object]) -> PlainValidator:
    """Validate a driver option's text with ``parse(value, name, url)``; the text is kept."""

    def validate(value: str, info: ValidationInfo) -> str:
        parse(value, str(info.field_name), _context(info).url)
        return value

    return PlainValidator(validate)


class _Options(BaseModel):
    """The options of a store URL's query, read (:meth:`read`) into the values in effect.

    A field is the package's own option (removed from the URL before the engine is made, written
    into the config URL when not its default) unless :attr:`DRIVER` names it: a driver's option
    checked here and left in the URL. Fields are validated in their order; the first refusal is
    raised, as a :class:`StoreConfigError` naming the option and the URL.
    """

    model_config = ConfigDict(frozen=True)
    DRIVER: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options read here: the package's own, then the driver's."""
        fields = tuple(cls.model_fields)
        return tuple(name for name in fields if name not in cls.DRIVER) + cls.DRIVER

    @classmethod
    def own(cls) -> tuple[str, ...]:
        """The package's own options."""
        return tuple(name for name in cls.model_fields if name not in cls.DRIVER)

    @classmethod
    def read(cls: type[_O], query: Mapping[str, str | tuple[str, ...]], url: str, **arguments: Any) -> _O:
        """The options of ``query`` (the URL's, ``url`` its text without password), merged with
        ``arguments``."""
        given = {name: query[name] for name in cls.names() if name in query}
        try:
            return cls.model_validate(given, context=_Context(url, arguments))
        except ValidationError as exc:  # a validator's StoreConfigError (a ValueError), wrapped
            raise exc.errors()[0]["ctx"]["error"] from None

    @_model_validator(mode="before")
    @classmethod
    def _given_once(cls, values: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        for name in cls.names():
            value = values.get(name)
            if isinstance(value, tuple):
                raise StoreConfigError(
                    f"option {name!r} is given {len(value)} times in the store URL {_context(info).url}; "
                    "give it once",
                    url=_context(info).url,
                    option=name,
                )
        return values

    def config_query(self) -> dict[str, str]:
        """The package options that differ from their defaults, as URL query text."""
        return {
            name: _text(value) for name in self.own() if (value := getattr(self, name)) != _DEFAULTS[name]
        }


_O = TypeVar("_O", bound=_Options)


class _SqliteOptions(_Options):
    """SQLite's: ``synchronous``, ``timeout`` (busy timeout, seconds), ``shared``; the driver's
    ``cached_statements``."""

    DRIVER: ClassVar[tuple[str, ...]] = ("cached_statements",)
    synchronous: Annotated[str, _option(lambda value, _, url: _synchronous(value, url, url=url))] = Field(
        None, validate_default=True
    )
    cached_statements: Annotated[
        str | None, _checked(lambda value, name, url: _number(value, name, url, integer=True))
    ] = None
    timeout: Annotated[float, _option(_number)] = Field(None, validate_default=True)
    shared: Annotated[bool, _option(_boolean)] = Field(None, validate_default=True)


class _PgOptions(_Options):
    """PostgreSQL's: ``pool_pre_ping``, ``shared``, ``statement_timeout`` and ``lock_timeout``
    (seconds, 0: none)."""

    pool_pre_ping: Annotated[bool, _option(_boolean)] = Field(None, validate_default=True)
    shared: Annotated[bool, _option(_boolean)] = Field(None, validate_default=True)
    statement_timeout: Annotated[float, _option(_number)] = Field(None, validate_default=True)
    lock_timeout: Annotated[float, _option(_number)] = Field(None, validate_default=True)


_SQLITE_OWN = _SqliteOptions.own()
_PG_OWN = _PgOptions.own()


@dataclass(frozen=True)
class StoreUrl:
    """A parsed store URL.

    Attributes:
        engine_url: what the engine connects with: the package options removed, PostgreSQL's driver
            set to ``postgresql+psycopg``.
        dialect: ``"sqlite"`` or ``"postgresql"``.
        synchronous: SQLite ``PRAGMA synchronous`` in effect (upper case).
        timeout: SQLite busy timeout in seconds.
        pool_pre_ping: PostgreSQL: test pooled connections before use.
        statement_timeout: PostgreSQL ``statement_timeout`` in seconds (0: none); the client also
            gives a connection up when the server has not answered within it plus a grace.
        lock_timeout: PostgreSQL ``lock_timeout`` in seconds (0: none).
        shared: the store may create its tables in a database (a PostgreSQL schema) that already
            holds other tables; without it such a database is refused.
        config_url: the URL as given, without its password, with the package options that differ
            from their defaults; ``parse_store_url(config_url)`` describes the same store.
        has_password: the URL carried a password (or another secret libpq parameter) that
            ``config_url`` leaves out.
    """

    engine_url: URL
    dialect: str
    synchronous: str
    timeout: float
    pool_pre_ping: bool
    shared: bool
    config_url: str
    has_password: bool
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT


def safe_url(url: str | URL) -> str:
    """``url`` as text with its password (and secret query parameters) replaced by ``***``."""
    try:
        parsed = sa.make_url(url) if isinstance(url, str) else url
    except sa.exc.ArgumentError:
        return "<unparseable database URL>"
    secrets = [key for key in parsed.query if key in SECRET_KEYS]
    text = parsed.update_query_dict(dict.fromkeys(secrets, "***")).render_as_string(hide_password=True)
    for key in secrets:  # rendering quotes the stars
        text = text.replace(f"{key}=%2A%2A%2A", f"{key}=***")
    return text


def parse_store_url(
    url: str,
    *,
    synchronous: str | None = None,
    pool_pre_ping: bool | None = None,
    shared: bool | None = None,
) -> StoreUrl:
    """Parse ``url``, check its query, and merge the package options with the keyword arguments.

    A keyword argument that is ``None`` takes the URL's value, else the default. A keyword argument
    for the other backend is checked but has no effect (a SQLite store has no ``pool_pre_ping``).

    Raises:
        StoreConfigError: the URL is malformed, names an unsupported backend or driver, carries an
            unknown or refused option or a bad value, or disagrees with a keyword argument.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise StoreConfigError(
            f"cannot parse database URL {safe_url(url)!r}: {exc}; "
            "use sqlite:///path/to/file.db or postgresql://user@host/dbname",
            url=None,
        ) from exc
    given = safe_url(parsed)  # as given, in messages
    parsed = _aliased(parsed)
    try:
        backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    except sa.exc.NoSuchModuleError as exc:  # a backend SQLAlchemy does not know
        raise StoreConfigError(
            f"unsupported database URL {given!r} (no SQLAlchemy dialect {parsed.drivername!r}); "
            "use sqlite:///path/to/file.db or postgresql://user@host/dbname",
            url=given,
        ) from exc
    if synchronous is not None:
        synchronous = _synchronous(synchronous, "", url=given)
    if backend == "sqlite" and driver in ("pysqlite", ""):
        _check_keys(parsed.query, _SqliteOptions.names(), "SQLite", given)
        lite = _SqliteOptions.read(parsed.query, given, synchronous=synchronous, shared=shared)
        return _result(parsed, parsed, "sqlite", lite)
    if backend == "postgresql" and (parsed.drivername == "postgresql" or driver == "psycopg"):
        libpq = libpq_keywords()
        _check_keys(parsed.query, _PG_OWN + libpq if libpq else None, "PostgreSQL", given)
        _check_libpq_options(parsed.query, given)
        pg = _PgOptions.read(parsed.query, given, pool_pre_ping=pool_pre_ping, shared=shared)
        return _result(parsed, parsed.set(drivername="postgresql+psycopg"), "postgresql", pg)
    raise StoreConfigError(
        f"unsupported database URL {given!r} (backend {backend!r}, driver {driver!r}); "
        "graphflow-durable supports sqlite:///path (the standard sqlite3 module) and "
        "postgresql:// or postgresql+psycopg:// (psycopg 3)",
        url=given,
    )


def _aliased(parsed: URL) -> URL:
    """``postgres://`` and ``postgres+DRIVER://``, as many hosting providers print a database URL, read
    as ``postgresql://`` and ``postgresql+DRIVER://`` (SQLAlchemy knows no ``postgres`` dialect)."""
    backend, plus, driver = parsed.drivername.partition("+")
    return parsed.set(drivername=f"postgresql{plus}{driver}") if backend == "postgres" else parsed


def _result(parsed: URL, engine_url: URL, dialect: str, options: _Options) -> StoreUrl:
    """The parsed URL: ``options`` in effect (the other backend's at their defaults), the engine URL
    and the config URL without the package options at their defaults and without secrets."""
    own = options.own()
    secrets = [key for key in parsed.query if key in SECRET_KEYS]
    config = (
        parsed._replace(password=None)
        .difference_update_query([*own, *secrets])
        .update_query_dict(options.config_query())
    )
    return StoreUrl(
        engine_url=engine_url.difference_update_query(own),
        dialect=dialect,
        config_url=config.render_as_string(hide_password=False),
        has_password=bool(parsed.password) or bool(secrets),
        **{**_DEFAULTS, **{name: getattr(options, name) for name in own}},
    )


@functools.cache
def libpq_keywords() -> tuple[str, ...]:
    """The connection parameters the installed libpq knows (empty when psycopg is not installed)."""
    try:
        from psycopg import pq
    except ImportError:
        return ()  # the engine will say that psycopg is missing
    return tuple(sorted(option.keyword.decode() for option in pq.Conninfo.get_defaults()))


def _check_libpq_options(query: Mapping[str, str | tuple[str, ...]], given: str) -> None:
    """Refuse ``statement_timeout`` or ``lock_timeout`` inside libpq ``options``: the store sets them."""
    options = query.get("options", ())
    for value in (options,) if isinstance(options, str) else options:
        found = _PG_SETTINGS.search(value)
        if found:
            name = found.group(0).lower().replace("-", "_")
            raise StoreConfigError(
                f"{name} in the libpq options of the store URL {given} is set by the store itself; "
                f"give it as a store URL option instead ({name}=SECONDS, 0 for none)",
                url=given,
                option=name,
            )


def _check_keys(query: Mapping[str, object], valid: tuple[str, ...] | None, backend: str, given: str) -> None:
    for key in query:
        if valid is None or key in valid:
            continue
        if backend == "SQLite":
            listing = f"valid options for SQLite: {', '.join(sorted(valid))}"
        else:
            libpq = ", ".join(name for name in valid if name not in _PG_OWN)
            listing = f"valid options for PostgreSQL: {', '.join(_PG_OWN)} and the libpq parameters {libpq}"
        if backend == "SQLite" and key in _SQLITE_REFUSED:
            raise StoreConfigError(
                f"option {key!r} in the store URL {given} is not supported: {_SQLITE_REFUSED[key]}; {listing}",
                url=given,
                option=key,
            )
        other = {"SQLite": ("PostgreSQL", _PG_OWN), "PostgreSQL": ("SQLite", _SQLITE_OWN)}[backend]
        hint = f" ({key!r} is a {other[0]} option)" if key in other[1] else ""
        raise StoreConfigError(
            f"unknown option {key!r} in the store URL {given}{hint}; {listing}", url=given, option=key
        )


def _where(given: str) -> str:
    return f" (in the store URL {given})" if given else ""


def _synchronous(value: str, given: str, *, url: str) -> str:
    """``given``: the URL when the value came from it (named in the message), else ``""``."""
    mode = value.upper()
    if mode not in SYNCHRONOUS_MODES:
        raise StoreConfigError(
            f"synchronous={value!r} is not a SQLite synchronous mode{_where(given)}; "
            f"use one of {', '.join(SYNCHRONOUS_MODES)} (any case)",
            url=url,
            option="synchronous",
        )
    return mode


def _boolean(value: str, name: str, given: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise StoreConfigError(
        f"{name}={value!r} is not true or false{_where(given)}; use {name}=true or {name}=false",
        url=given,
        option=name,
    )


def _number(value: str, name: str, given: str, *, integer: bool = False) -> float:
    kind = "a whole number" if integer else "a number of seconds"
    try:
        number = float(int(value) if integer else float(value))
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise StoreConfigError(f"{name}={value!r} is not {kind} >= 0{_where(given)}", url=given, option=name)
    return number


def _text(value: object) -> str:
    """An option's value as URL query text (a whole number of seconds without ``.0``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _merge(name: str, argument: _T | None, from_url: _T | None, default: _T, given: str) -> _T:
    if argument is not None and from_url is not None and argument != from_url:
        raise StoreConfigError(
            f"{name} is given twice with different values: {name}={argument!r} as an argument and "
            f"{name}={from_url!r} in the store URL {given}; give it in one place",
            url=given,
            option=name,
        )
    if argument is not None:
        return argument
    return default if from_url is None else from_url
