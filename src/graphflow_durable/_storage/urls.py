"""Store URLs: the package's options in the query, the driver's options, and the URL to write back.

A store URL is a SQLAlchemy URL. Its query may hold two kinds of options:

- the package's own (SQLite ``synchronous`` and ``timeout``, PostgreSQL ``pool_pre_ping``,
  ``statement_timeout`` and ``lock_timeout``, both ``shared``): read here and removed from the URL
  before the engine is made;
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

import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import sqlalchemy as sa
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

_SQLITE_OWN = ("synchronous", "timeout", "shared")
_SQLITE_DRIVER = ("cached_statements",)
#: pysqlite options SQLAlchemy would read from the query, refused because they break the engine set-up.
_SQLITE_REFUSED = {
    "uri": "SQLite URI filenames are not supported; give a plain path (sqlite:///path/to/runs.db)",
    "isolation_level": "the store runs SQLite's transactions itself (BEGIN, BEGIN IMMEDIATE for writers)",
    "check_same_thread": "the store sets it to false itself (a store is shared between threads)",
    "detect_types": "it would change the values the store reads back",
}
_PG_OWN = ("pool_pre_ping", "shared", "statement_timeout", "lock_timeout")
#: Server settings the store sets itself, refused inside libpq ``options`` (one place to give them).
_PG_SETTINGS = re.compile(r"(statement|lock)[_-]timeout", re.IGNORECASE)
_T = TypeVar("_T")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


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
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    given = safe_url(parsed)
    if synchronous is not None:
        synchronous = _synchronous(synchronous, "", url=given)
    if backend == "sqlite" and driver in ("pysqlite", ""):
        _check_keys(parsed.query, _SQLITE_OWN + _SQLITE_DRIVER, "SQLite", given)
        own = _own_values(parsed.query, _SQLITE_OWN + _SQLITE_DRIVER, given)
        from_url = _synchronous(own["synchronous"], given, url=given) if "synchronous" in own else None
        if "cached_statements" in own:
            _number(own["cached_statements"], "cached_statements", given, integer=True)
        sync = _merge("synchronous", synchronous, from_url, DEFAULT_SYNCHRONOUS, given)
        timeout = _number(own["timeout"], "timeout", given) if "timeout" in own else DEFAULT_TIMEOUT
        share = _shared(own, shared, given)
        extras = {"synchronous": sync} if sync != DEFAULT_SYNCHRONOUS else {}
        if timeout != DEFAULT_TIMEOUT:
            extras["timeout"] = str(int(timeout)) if timeout.is_integer() else repr(timeout)
        if share:
            extras["shared"] = "true"
        return _result(
            parsed, parsed, "sqlite", _SQLITE_OWN, extras, sync, timeout, DEFAULT_POOL_PRE_PING, share
        )
    if backend in ("postgresql", "postgres") and (
        parsed.drivername in ("postgresql", "postgres") or driver == "psycopg"
    ):
        libpq = libpq_keywords()
        _check_keys(parsed.query, _PG_OWN + libpq if libpq else None, "PostgreSQL", given)
        own = _own_values(parsed.query, _PG_OWN, given)
        ping_url = _boolean(own["pool_pre_ping"], "pool_pre_ping", given) if "pool_pre_ping" in own else None
        ping = _merge("pool_pre_ping", pool_pre_ping, ping_url, DEFAULT_POOL_PRE_PING, given)
        share = _shared(own, shared, given)
        extras = {} if ping else {"pool_pre_ping": "false"}
        if share:
            extras["shared"] = "true"
        timeouts = _pg_timeouts(parsed.query, own, extras, given)
        engine_url = parsed.set(drivername="postgresql+psycopg")
        result = _result(
            parsed,
            engine_url,
            "postgresql",
            _PG_OWN,
            extras,
            DEFAULT_SYNCHRONOUS,
            DEFAULT_TIMEOUT,
            ping,
            share,
        )
        return dataclasses.replace(result, statement_timeout=timeouts[0], lock_timeout=timeouts[1])
    raise StoreConfigError(
        f"unsupported database URL {given!r} (backend {backend!r}, driver {driver!r}); "
        "graphflow-durable supports sqlite:///path (the standard sqlite3 module) and "
        "postgresql:// or postgresql+psycopg:// (psycopg 3)",
        url=given,
    )


def _result(
    parsed: URL,
    engine_url: URL,
    dialect: str,
    own: tuple[str, ...],
    extras: dict[str, str],
    synchronous: str,
    timeout: float,
    pool_pre_ping: bool,
    shared: bool,
) -> StoreUrl:
    secrets = [key for key in parsed.query if key in SECRET_KEYS]
    config = (
        parsed._replace(password=None).difference_update_query([*own, *secrets]).update_query_dict(extras)
    )
    return StoreUrl(
        engine_url=engine_url.difference_update_query(own),
        dialect=dialect,
        synchronous=synchronous,
        timeout=timeout,
        pool_pre_ping=pool_pre_ping,
        shared=shared,
        config_url=config.render_as_string(hide_password=False),
        has_password=bool(parsed.password) or bool(secrets),
    )


@functools.cache
def libpq_keywords() -> tuple[str, ...]:
    """The connection parameters the installed libpq knows (empty when psycopg is not installed)."""
    try:
        from psycopg import pq
    except ImportError:
        return ()  # the engine will say that psycopg is missing
    return tuple(sorted(option.keyword.decode() for option in pq.Conninfo.get_defaults()))


def _pg_timeouts(
    query: Mapping[str, str | tuple[str, ...]], own: Mapping[str, str], extras: dict[str, str], given: str
) -> tuple[float, float]:
    """``statement_timeout`` and ``lock_timeout`` (seconds) from the URL; non-defaults go to ``extras``."""
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
    values: list[float] = []
    for name, default in (
        ("statement_timeout", DEFAULT_STATEMENT_TIMEOUT),
        ("lock_timeout", DEFAULT_LOCK_TIMEOUT),
    ):
        seconds = _number(own[name], name, given) if name in own else default
        if seconds != default:
            extras[name] = str(int(seconds)) if seconds.is_integer() else repr(seconds)
        values.append(seconds)
    return values[0], values[1]


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


def _own_values(
    query: Mapping[str, str | tuple[str, ...]], names: tuple[str, ...], given: str
) -> dict[str, str]:
    values: dict[str, str] = {}
    for name in names:
        value = query.get(name)
        if isinstance(value, tuple):
            raise StoreConfigError(
                f"option {name!r} is given {len(value)} times in the store URL {given}; give it once",
                url=given,
                option=name,
            )
        if value is not None:
            values[name] = value
    return values


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


def _shared(own: Mapping[str, str], argument: bool | None, given: str) -> bool:
    from_url = _boolean(own["shared"], "shared", given) if "shared" in own else None
    return _merge("shared", argument, from_url, DEFAULT_SHARED, given)


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
