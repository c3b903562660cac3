"""Shared fixtures: real SQLite files and a real PostgreSQL server.

- ``postgres_url`` (session): a PostgreSQL server's URL, from ``GRAPHFLOW_TEST_POSTGRES_URL`` or a
  throw-away cluster started by ``tests/pgcluster.py``. Without PostgreSQL the tests that need it
  are skipped, except on CI (``CI=true``) where they fail.
- ``store_url`` (function, parametrized ``sqlite`` / ``postgres``): a fresh, empty database.
- ``store``: a :class:`Store` open on ``store_url``, closed afterwards.
- ``small_disk``: a 2 MB file system the test may fill (``tests/smalldisk.py``; root only).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from graphflow_durable.store import Store

sys.path.insert(0, str(Path(__file__).parent))

from pgcluster import ClusterUnavailable, PgCluster
from smalldisk import SmallDisk

_db_numbers = itertools.count()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a PostgreSQL server whose user may CREATE DATABASE."""
    given = os.environ.get("GRAPHFLOW_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    try:
        cluster = PgCluster.start()
    except ClusterUnavailable as exc:
        reason = f"PostgreSQL not available: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: PostgreSQL tests must run on CI)")
        pytest.skip(reason)
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def postgres_test_database(postgres_url: str) -> Iterator[str]:
    """URL of a database created for this test session (dropped at its end)."""
    url = sa.make_url(postgres_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    name = f"graphflow_test_{os.getpid()}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield url.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_admin(postgres_test_database: str) -> Iterator[sa.Engine]:
    """An autocommit engine on the session's test database, for CREATE/DROP SCHEMA."""
    engine = sa.create_engine(postgres_test_database, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_database(postgres_test_database: str, postgres_admin: sa.Engine) -> Iterator[str]:
    """URL of a new, empty PostgreSQL schema (the only one on the search path), dropped afterwards.

    A schema per test instead of a database per test: CREATE DATABASE costs ~0.35 s here.
    """
    name = f"t{next(_db_numbers)}"
    with postgres_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    try:
        url = sa.make_url(postgres_test_database)
        yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
            hide_password=False
        )
    finally:
        with postgres_admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a new SQLite file."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_database"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A Store open on a fresh database (closed after the test)."""
    opened = Store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 2 MB tmpfs (needs root to mount; skipped otherwise), unmounted afterwards."""
    yield from SmallDisk.mount(tmp_path / "disk")
