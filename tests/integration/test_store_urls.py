"""Store URLs: package options in the query take effect, driver options pass through, unknown or
conflicting options are refused, and config_url round-trips without the password."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable
from graphflow_durable import DurableGraphFlow
from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE, main
from graphflow_durable.errors import StoreConfigError, StoreError
from graphflow_durable.flow import DEFAULT_STORE_ENV
from graphflow_durable.store import Store

from .test_store import commit_text, start
from .test_store_engines import pragmas

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))

from poolteam import team


def with_query(url: str, **options: str) -> str:
    return sa.make_url(url).update_query_dict(options).render_as_string(hide_password=False)


# --- SQLite: options in effect ---------------------------------------------------------------------


def test_synchronous_normal_in_a_sqlite_url_is_in_effect_on_reads_and_commits(sqlite_url: str) -> None:
    with Store(f"{sqlite_url}?synchronous=normal") as store:
        assert pragmas(store)["synchronous"] == 1
        commit_text(store, "run-1", 0, start(store), 0)
        writer = store._writer._kept  # the connection the commit path keeps between commits
        assert writer is not None
        assert writer.cursor().execute("PRAGMA synchronous").fetchone()[0] == 1


def test_timeout_in_a_sqlite_url_sets_the_busy_timeout(sqlite_url: str) -> None:
    with Store(f"{sqlite_url}?timeout=2.5") as store:
        assert pragmas(store)["busy_timeout"] == 2500


def test_cached_statements_passes_through_to_sqlite3_without_a_warning(sqlite_url: str) -> None:
    with Store(f"{sqlite_url}?cached_statements=16&synchronous=OFF") as store:  # warnings are errors
        assert pragmas(store)["synchronous"] == 0
        assert commit_text(store, "run-1", 0, start(store), 0) == 1


def test_the_same_option_as_an_argument_and_in_the_url_is_accepted_when_they_agree(sqlite_url: str) -> None:
    with Store(f"{sqlite_url}?synchronous=NORMAL", synchronous="normal") as store:
        assert pragmas(store)["synchronous"] == 1


def test_a_durable_graph_flow_store_url_carries_its_options(sqlite_url: str) -> None:
    flow = team("r", store=f"{sqlite_url}?synchronous=NORMAL")
    try:
        assert pragmas(flow.store)["synchronous"] == 1
    finally:
        flow.store.close()


# --- refusals --------------------------------------------------------------------------------------


def test_an_unknown_option_is_refused_naming_it_and_the_valid_ones() -> None:
    url = "sqlite:///runs.db?synchronus=NORMAL"
    with pytest.raises(StoreConfigError) as info:
        Store(url)
    assert str(info.value) == (
        "unknown option 'synchronus' in the store URL sqlite:///runs.db?synchronus=NORMAL; "
        "valid options for SQLite: cached_statements, shared, synchronous, timeout"
    )
    assert isinstance(info.value, ValueError) and isinstance(info.value, StoreError)


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ("uri=true", "SQLite URI filenames are not supported"),
        ("isolation_level=DEFERRED", "the store runs SQLite's transactions itself"),
        ("check_same_thread=true", "shared between threads"),
        ("detect_types=1", "change the values the store reads back"),
    ],
)
def test_pysqlite_options_that_would_break_the_engine_set_up_are_refused_with_the_reason(
    sqlite_url: str, option: str, reason: str
) -> None:
    with pytest.raises(
        StoreConfigError, match=f"option '{option.split('=')[0]}' .* is not supported: .*{reason}"
    ):
        Store(f"{sqlite_url}?{option}")
    assert not Path(sa.make_url(sqlite_url).database or "").exists()


def test_an_argument_and_a_url_option_that_disagree_are_refused(sqlite_url: str) -> None:
    with pytest.raises(StoreConfigError, match=r"synchronous is given twice with different values: "):
        Store(f"{sqlite_url}?synchronous=NORMAL", synchronous="FULL")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("synchronous=FAST", "synchronous='FAST' is not a SQLite synchronous mode"),
        ("timeout=soon", "timeout='soon' is not a number of seconds >= 0"),
        ("timeout=-1", "timeout='-1' is not a number of seconds >= 0"),
        ("cached_statements=many", "cached_statements='many' is not a whole number >= 0"),
        ("synchronous=NORMAL&synchronous=FULL", "option 'synchronous' is given 2 times"),
        (
            "pool_pre_ping=false",
            r"unknown option 'pool_pre_ping' .*\('pool_pre_ping' is a PostgreSQL option\)",
        ),
    ],
)
def test_bad_values_in_a_sqlite_url_are_refused(sqlite_url: str, query: str, message: str) -> None:
    with pytest.raises(StoreConfigError, match=message):
        Store(f"{sqlite_url}?{query}")


def test_a_postgresql_url_refuses_unknown_options_without_showing_the_password() -> None:
    url = "postgresql://alice:s3cr3t-pw@127.0.0.1:1/db?synchronous=NORMAL&password=s3cr3t-pw"
    with pytest.raises(StoreConfigError) as info:
        Store(url)
    message = str(info.value)
    assert "s3cr3t-pw" not in message and "\n" not in message
    assert message.startswith(
        "unknown option 'synchronous' in the store URL postgresql://alice:***@127.0.0.1:1"
    )
    assert "password=***" in message
    assert (
        "valid options for PostgreSQL: pool_pre_ping, shared, statement_timeout, lock_timeout and the "
        "libpq parameters " in message
    )
    assert "connect_timeout" in message and "application_name" in message


@pytest.mark.parametrize("query", ["pool_pre_ping=maybe", "prepare_threshold=5", "autocommit=true"])
def test_a_postgresql_url_refuses_what_is_neither_ours_nor_libpqs(query: str) -> None:
    with pytest.raises(StoreConfigError, match=query.split("=")[0]):
        Store(f"postgresql://alice@127.0.0.1:1/db?{query}")


# --- config_url ------------------------------------------------------------------------------------


def test_config_url_puts_arguments_in_the_query_and_keeps_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Store("sqlite:///a.db", synchronous="NORMAL") as store:
        assert store.config_url == "sqlite:///a.db?synchronous=NORMAL"
        assert store.has_password is False
    with Store("sqlite:///a.db") as store:
        assert store.config_url == "sqlite:///a.db"  # defaults are omitted
    with Store("sqlite:///a.db?synchronous=full&timeout=30") as store:
        assert store.config_url == "sqlite:///a.db"


def test_config_url_opens_the_same_sqlite_database_with_the_same_options(sqlite_url: str) -> None:
    with Store(f"{sqlite_url}?timeout=5&cached_statements=16", synchronous="NORMAL") as first:
        start(first)
        config = first.config_url
        before = pragmas(first)
    assert config == f"{sqlite_url}?cached_statements=16&synchronous=NORMAL&timeout=5"
    with Store(config) as again:
        assert pragmas(again) == before == {**before, "synchronous": 1, "busy_timeout": 5000}
        assert [r.run_id for r in again.list_runs()] == ["run-1"]
        assert again.config_url == config


def test_config_url_drops_the_password_and_secret_parameters_and_keeps_the_rest() -> None:
    from graphflow_durable._storage.urls import parse_store_url

    parsed = parse_store_url(
        "postgresql://app:pw@db:5433/agents?sslmode=require&sslpassword=kp&pool_pre_ping=false"
    )
    assert parsed.config_url == "postgresql://app@db:5433/agents?pool_pre_ping=false&sslmode=require"
    assert parsed.has_password
    again = parse_store_url(parsed.config_url)
    assert again.engine_url.render_as_string(hide_password=False) == (
        "postgresql+psycopg://app@db:5433/agents?sslmode=require"
    )
    assert again.pool_pre_ping is False and again.has_password is False


# --- PostgreSQL on the real server -----------------------------------------------------------------


@pytest.mark.postgres
def test_libpq_parameters_in_a_postgresql_url_reach_the_server(postgres_database: str) -> None:
    url = with_query(postgres_database, application_name="gfd-url-test", connect_timeout="5")
    with Store(url) as store:
        with store._e.read.connect() as conn:
            assert conn.exec_driver_sql("SHOW application_name").scalar() == "gfd-url-test"
            names = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gfd-url-test'"
            ).scalar()
            assert names == 1
        assert commit_text(store, "run-1", 0, start(store), 0) == 1
        assert store._e.engine.pool._pre_ping is True


@pytest.mark.postgres
def test_pool_pre_ping_false_in_a_postgresql_url_turns_it_off_and_stays_in_the_config_url(
    postgres_database: str,
) -> None:
    with Store(with_query(postgres_database, pool_pre_ping="false")) as store:
        assert store._e.engine.pool._pre_ping is False
        assert "pool_pre_ping=false" in store.config_url
        start(store)
        with Store(store.config_url) as again:
            assert again._e.engine.pool._pre_ping is False
            assert [r.run_id for r in again.list_runs()] == ["run-1"]
    with pytest.raises(StoreConfigError, match="pool_pre_ping is given twice"):
        Store(with_query(postgres_database, pool_pre_ping="false"), pool_pre_ping=True)


@pytest.mark.postgres
def test_a_unix_socket_directory_as_host_in_the_query_connects_over_the_socket(
    postgres_database: str, postgres_admin: sa.Engine
) -> None:
    with postgres_admin.connect() as conn:
        socket_dir = str(conn.exec_driver_sql("SHOW unix_socket_directories").scalar()).split(",")[0]
    if not socket_dir or not Path(socket_dir).is_dir():
        pytest.skip(f"the server's socket directory {socket_dir!r} is not on this machine")
    tcp = sa.make_url(postgres_database)
    url = with_query(tcp.set(host="", port=None).render_as_string(hide_password=False), host=socket_dir)
    url = with_query(url, port=str(tcp.port))
    with Store(url) as store:
        with store._e.read.connect() as conn:
            assert conn.exec_driver_sql("SELECT inet_server_addr()").scalar() is None  # a socket
        start(store)
        with Store(store.config_url) as again:
            assert [r.run_id for r in again.list_runs()] == ["run-1"]


@pytest.fixture
def password_role(postgres_database: str, postgres_admin: sa.Engine) -> Iterator[tuple[str, str]]:
    """A role that must log in with a password over TCP; yields (its URL with the password, the password)."""
    if os.environ.get("GRAPHFLOW_TEST_POSTGRES_URL"):
        pytest.skip("needs the throw-away test cluster: it edits the server's pg_hba.conf")
    with postgres_admin.connect() as conn:
        hba = Path(str(conn.exec_driver_sql("SHOW hba_file").scalar()))
        if not os.access(hba, os.W_OK):
            pytest.skip(f"cannot edit {hba} to require a password (not our own test cluster)")
        role, password = f"gfd_pw_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        schema = sa.make_url(postgres_database).query["options"].split("=", 1)[1]  # type: ignore[union-attr]
        original = hba.read_text()
        hba.write_text(
            f"host all {role} 127.0.0.1/32 scram-sha-256\nhost all {role} ::1/128 scram-sha-256\n{original}"
        )
        conn.exec_driver_sql("SET password_encryption = 'scram-sha-256'")
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.exec_driver_sql(f'ALTER SCHEMA "{schema}" OWNER TO {role}')
        conn.exec_driver_sql("SELECT pg_reload_conf()")
    url = sa.make_url(postgres_database).set(username=role, password=password, host="127.0.0.1")
    try:
        yield url.render_as_string(hide_password=False), password
    finally:
        hba.write_text(original)
        with postgres_admin.connect() as conn:
            conn.exec_driver_sql("SELECT pg_reload_conf()")
            conn.exec_driver_sql(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")


@pytest.mark.postgres
def test_config_url_has_no_password_and_libpq_supplies_it_from_pgpassword(
    password_role: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, password = password_role
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    with Store(url) as store:
        start(store)
        config = store.config_url
        assert store.has_password
        assert password not in config and ":***@" not in config
        assert sa.make_url(config).username == sa.make_url(url).username
    with pytest.raises(StoreError) as info:  # the server really asks for the password
        Store(config)
    assert "password" in str(info.value) and password not in str(info.value)
    monkeypatch.setenv("PGPASSWORD", password)
    with Store(config) as again:
        assert [r.run_id for r in again.list_runs()] == ["run-1"]
        assert again.has_password is False


# --- the CLI ---------------------------------------------------------------------------------------


def test_the_cli_worker_accepts_options_in_the_store_url(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GFD_AGENT_DELAY", "0")
    url = f"{sqlite_url}?synchronous=NORMAL"
    with Store(url) as store:
        store.queue.submit("r1", task="hello", team="t")
    assert main(["worker", "--store", url, "--team", "t=poolteam:team", "--until-idle"]) == EXIT_OK
    capsys.readouterr()
    with Store(url) as store:
        run = store.get_run("r1")
        assert run is not None and run.status == "finished"


@pytest.mark.parametrize(
    "command", [["worker", "--team", "t=poolteam:team"], ["runs", "list"], ["submit", "r", "t"]]
)
def test_the_cli_reports_a_bad_store_url_in_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}?synchronus=NORMAL"
    head = 2 if command[0] == "runs" else 1  # --store goes after the (sub)command
    argv = [*command[:head], "--store", url, *command[head:]]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("graphflow-durable: unknown option 'synchronus' in the store URL sqlite:///")
    assert not (tmp_path / "x.db").exists()


# --- DurableGraphFlow: the URL is checked where it is written --------------------------------------


def test_a_durable_graph_flow_refuses_an_unknown_store_url_option_when_constructed(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with pytest.raises(StoreConfigError) as info:
        team("r", store=f"sqlite:///{path}?synchronus=NORMAL")
    message = str(info.value)
    assert message.startswith("unknown option 'synchronus' in the store URL sqlite:///")
    assert "valid options for SQLite: cached_statements, shared, synchronous, timeout" in message
    assert info.value.option == "synchronus" and isinstance(info.value, ValueError)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("sqlite:///{path}?synchronous=FASTER", "synchronous='FASTER' is not a SQLite synchronous mode"),
        ("sqlite:///{path}?timeout=soon", "timeout='soon' is not a number of seconds"),
        ("mysql:///{path}", "unsupported database URL"),
    ],
)
def test_a_durable_graph_flow_refuses_a_bad_store_url_value_or_backend_when_constructed(
    tmp_path: Path, store: str, message: str
) -> None:
    with pytest.raises(StoreConfigError, match=message):
        team("r", store=store.format(path=tmp_path / "x.db"))
    assert list(tmp_path.iterdir()) == []


def test_a_durable_graph_flow_refuses_a_bad_postgresql_option_when_constructed_hiding_the_password() -> None:
    with pytest.raises(StoreConfigError, match="unknown option 'statement_timeot'") as info:
        team("r", store="postgresql://app:s3cr3t-pw@db.invalid/agents?statement_timeot=5")
    assert "s3cr3t-pw" not in str(info.value) and "app:***@db.invalid" in str(info.value)


def test_load_component_refuses_a_config_whose_store_url_has_an_unknown_option(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    config = team("r", store=f"sqlite:///{path}").dump_component()
    config.config["store"] = f"sqlite:///{path}?synchronus=NORMAL"
    with pytest.raises(StoreConfigError, match="unknown option 'synchronus' in the store URL"):
        DurableGraphFlow.load_component(config)
    assert list(tmp_path.iterdir()) == []


def test_a_good_store_url_constructs_and_loads_without_creating_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    built = team("r", store=f"sqlite:///{path}?synchronous=NORMAL&timeout=5")
    loaded = DurableGraphFlow.load_component(built.dump_component())
    assert built.run_id == loaded.run_id == "r"
    assert list(tmp_path.iterdir()) == []  # opened on first use, as before


# --- postgres:// (as hosting providers print it) ---------------------------------------------------


def _scheme(url: str, drivername: str, password: str) -> str:
    return (
        sa.make_url(url).set(drivername=drivername, password=password).render_as_string(hide_password=False)
    )


@pytest.mark.postgres
@pytest.mark.parametrize("drivername", ["postgres", "postgres+psycopg"])
async def test_a_postgres_scheme_url_is_read_as_postgresql_wherever_a_store_url_is_taken(
    postgres_database: str,
    drivername: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = _scheme(postgres_database, drivername, "s3cr3t-pw")  # trust auth: the password is unused
    written = drivername.replace("postgres", "postgresql") + "://postgres@"  # in a component config
    with Store(url) as store:
        assert store.config_url.startswith(written) and store.has_password
        store.queue.submit("submitted", task="hello", team="t")

    a, b = Scripted("a"), Scripted("b")
    flow = durable([a, b], chain(a, b), url, "driven")
    result = await flow.run(task="go")
    assert [m.source for m in result.messages] == ["user", "a", "b"]
    assert str(flow.dump_component().config["store"]).startswith(written)
    close_stores()

    assert main(["runs", "list", "--json", "--store", url]) == EXIT_OK
    listed = capsys.readouterr().out
    monkeypatch.setenv(DEFAULT_STORE_ENV, url)
    assert main(["runs", "list", "--json"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert out == listed and "driven" in out and "submitted" in out, err
    assert "s3cr3t-pw" not in caplog.text + listed + out + err


@pytest.mark.parametrize("drivername", ["postgres", "postgres+psycopg"])
def test_a_postgres_scheme_url_that_fails_says_why_without_its_password(
    drivername: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    refused = f"{drivername}://app:s3cr3t-pw@127.0.0.1:1/agents?statement_timeot=5"
    with pytest.raises(StoreConfigError) as info:
        Store(refused)
    assert str(info.value).startswith(
        f"unknown option 'statement_timeot' in the store URL {drivername}://app:***@"
    )
    with pytest.raises(StoreConfigError, match="unknown option 'statement_timeot'") as built:
        team("r", store=refused)
    assert main(["runs", "list", "--store", refused]) == EXIT_USAGE
    # No server there: the store cannot be opened (exit 1, the store's error, not an unexpected one).
    assert main(["runs", "list", "--store", f"{drivername}://app:s3cr3t-pw@127.0.0.1:1/agents"]) == 1
    out, err = capsys.readouterr()
    assert "unexpected" not in err and "app:***@127.0.0.1:1/agents" in err, err
    assert err.count("\n") == 2 and "Traceback" not in err
    assert "s3cr3t-pw" not in str(info.value) + str(built.value) + out + err + caplog.text
