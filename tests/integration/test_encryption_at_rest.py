"""Encryption at rest, on SQLite and PostgreSQL: with a codec, no byte of a run's content reaches
the database (the SQLite file and its WAL, PostgreSQL's ``pg_dump``); a ciphertext moved to another
run, seq or column is corruption naming its row; a wrong or missing key is a configuration error
naming the key id; a plain row is refused unless ``allow_plaintext``; a store without the codec
never writes plain content into a sealed run."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import sqlite3
import subprocess
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
import sqlalchemy as sa
from autogen_agentchat.agents import AssistantAgent, UserProxyAgent
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelInfo,
    RequestUsage,
)
from autogen_core.tools import FunctionTool, Tool, ToolSchema
from pydantic import BaseModel

from agents import Scripted, chain, close_stores
from graphflow_durable import DurableGraphFlow, HumanInput, SealedValue, Store
from graphflow_durable._storage.checksum import message_sum
from graphflow_durable._storage.sealing import SEALED, is_sealed
from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.errors import StoreConfigError, StoreCorruptError
from pgcluster import find_bin_dir
from processes import last_json, run_script

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))

#: The content of the run: none of these may reach the database in plain.
TASK = "TASK-4f1c-marmalade"
TOOL_ARG = "ACCT-9931-quince"
TOOL_RESULT = "TOOLRESULT-77-saffron"
MODEL_TEXT = "MODELSAYS-31-juniper"
ANSWER = "ANSWER-52-tamarind"
DEFAULT = "DEFAULT-08-galangal"
ERROR = "ERRQUOTE-18-cardamom"
QUEUED = "QUEUETASK-64-fennel"
SECRETS = (TASK, TOOL_ARG, TOOL_RESULT, MODEL_TEXT, ANSWER, DEFAULT, ERROR, QUEUED)


def codec(keys: Mapping[str, bytes] | None = None, active: str | None = None) -> AESGCMCodec:
    return AESGCMCodec(dict(keys or {"k1": KEY}), active=active)


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


class Model(ChatCompletionClient):
    """Calls the ``lookup`` tool with :data:`TOOL_ARG`, then answers :data:`MODEL_TEXT`."""

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type[BaseModel] | None = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: CancellationToken | None = None,
    ) -> CreateResult:
        usage = RequestUsage(prompt_tokens=10, completion_tokens=5)
        if any(isinstance(m, FunctionExecutionResultMessage) for m in messages):
            return CreateResult(finish_reason="stop", content=f"{MODEL_TEXT}", usage=usage, cached=False)
        call = FunctionCall(id="c1", name="lookup", arguments=json.dumps({"account": TOOL_ARG}))
        return CreateResult(finish_reason="function_calls", content=[call], usage=usage, cached=False)

    def create_stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[str | CreateResult, None]:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    def actual_usage(self) -> RequestUsage:
        return RequestUsage(prompt_tokens=0, completion_tokens=0)

    def total_usage(self) -> RequestUsage:
        return RequestUsage(prompt_tokens=0, completion_tokens=0)

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return 0

    def remaining_tokens(
        self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []
    ) -> int:
        return 1000

    @property
    def capabilities(self) -> Any:
        return self.model_info

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(
            vision=False, function_calling=True, json_output=False, family="scripted", structured_output=False
        )


async def lookup(account: str) -> str:
    """Look an account up."""
    return f"{TOOL_RESULT} for {account}"


async def refuse(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    raise ValueError(f"cannot handle {ERROR}: {messages[-1].to_text()}")


def full_team(store: Store) -> DurableGraphFlow:
    """A (a model calling a tool, recorded) -> H (a person, waited for) -> F (fails quoting content)."""
    a = AssistantAgent(
        "A",
        model_client=Model(),
        tools=[FunctionTool(lookup, "Look an account up.")],
        max_tool_iterations=3,
    )
    h = UserProxyAgent("H", input_func=lambda prompt: "unused")
    f = Scripted("F", before=refuse)
    graph = DiGraphBuilder().add_node(a).add_node(h).add_node(f).add_edge(a, h).add_edge(h, f).build()
    return DurableGraphFlow(
        [a, h, f],
        graph,
        store=store,
        run_id="full",
        record_calls=True,
        human_input=HumanInput("wait", timeout=3600, default=DEFAULT),
    )


async def drive_everything(store: Store) -> None:
    """A run with every kind of content: task, model text, tool call and result (recorded), a
    person's prompt, default and answer, a failure quoting content; a queued task."""
    team = full_team(store)
    await team.run(task=TASK)
    assert store.get_run("full").status == "waiting"  # type: ignore[union-attr]
    store.respond("full", ANSWER)
    with pytest.raises(RuntimeError, match=ERROR):
        await team.run()
    assert store.get_run("full").status == "failed"  # type: ignore[union-attr]
    store.queue.submit("queued", task={"text": QUEUED}, team="t")
    store.queue.record_failure("queued", error=f"boom on {QUEUED}", retry_at=0.0)


def stored_bytes(url: str) -> list[tuple[str, bytes]]:
    """What the database holds on disk: SQLite's WAL (before a checkpoint) and main file (after a
    TRUNCATE checkpoint) and its WAL then; PostgreSQL's ``pg_dump`` of the store's schema."""
    made = sa.make_url(url)
    if made.get_backend_name() == "sqlite":
        path = Path(str(made.database))
        wal = path.with_name(path.name + "-wal")
        found = [("wal before checkpoint", wal.read_bytes() if wal.exists() else b"")]
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        found.append(("main file", path.read_bytes()))
        found.append(("wal", wal.read_bytes() if wal.exists() else b""))
        return found
    bin_dir = find_bin_dir()
    assert bin_dir is not None
    schema = made.query["options"].split("=", 1)[1]  # type: ignore[union-attr]
    dsn = made.set(drivername="postgresql").difference_update_query(["options"])
    dump = subprocess.run(
        [str(bin_dir / "pg_dump"), "--schema", schema, dsn.render_as_string(hide_password=False)],
        capture_output=True,
        check=True,
    )
    return [("pg_dump", dump.stdout)]


def test_no_byte_of_a_runs_content_reaches_the_database(store_url: str) -> None:
    store = Store(store_url, codec=codec())
    asyncio.run(drive_everything(store))
    # what the store hands back is the plain content
    log = store.load("full")
    texts = json.dumps([m.body for m in log.messages])
    assert TASK in texts and MODEL_TEXT in texts and TOOL_RESULT in texts and ANSWER in texts
    assert [r.answer for r in store.requests.of_run("full")] == [ANSWER]
    assert store.requests.of_run("full")[0].default == DEFAULT
    assert any(TOOL_RESULT in str(c.result) for c in store.calls.list("full"))
    submitted = store.queue.get_submission("queued")
    assert (
        submitted is not None and submitted.task == {"text": QUEUED} and QUEUED in str(submitted.last_error)
    )
    assert ERROR in str(store.queue.get_submission("full").last_error)  # type: ignore[union-attr]
    store.close()
    # every content value stored is sealed (the prompt too)
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        for table, (_, columns) in SEALED.items():
            for column in columns:
                values = conn.execute(sa.text(f"SELECT {column} FROM {table}")).scalars().all()
                plain = [v for v in values if v is not None and not is_sealed(v)]
                assert plain == [], (table, column, plain[:1])
        assert conn.execute(sa.text("SELECT count(*) FROM graphflow_input_requests")).scalar_one() == 1
    engine.dispose()
    for where, data in stored_bytes(store_url):
        for secret in SECRETS:
            assert secret.encode() not in data, (secret, where)


def two_runs(url: str) -> Store:
    """Runs ``r1`` and ``r2`` (a two-agent chain each) written with the codec."""
    store = Store(url, codec=codec())
    for run_id in ("r1", "r2"):
        a, b = Scripted("A"), Scripted("B")
        asyncio.run(DurableGraphFlow([a, b], chain(a, b), store=store, run_id=run_id).run(task=f"t {run_id}"))
    return store


def move_body(url: str, source: tuple[str, int], target: tuple[str, int]) -> None:
    """Copy the stored body of message ``source`` over ``target``'s, its checksum made to match (a
    checksum is no seal: anyone who can write the row can compute it)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        body = conn.execute(
            sa.text("SELECT body FROM graphflow_messages WHERE run_id = :r AND seq = :s"),
            {"r": source[0], "s": source[1]},
        ).scalar_one()
        row = conn.execute(
            sa.text("SELECT step_seq, published FROM graphflow_messages WHERE run_id = :r AND seq = :s"),
            {"r": target[0], "s": target[1]},
        ).one()
        checksum = message_sum(target[0], target[1], row.step_seq, row.published, body)
        conn.execute(
            sa.text("UPDATE graphflow_messages SET body = :b, checksum = :c WHERE run_id = :r AND seq = :s"),
            {"b": body, "c": checksum, "r": target[0], "s": target[1]},
        )
    engine.dispose()


@pytest.mark.parametrize(
    ("source", "target"),
    [(("r2", 1), ("r1", 1)), (("r1", 2), ("r1", 1))],
    ids=["another run", "another seq"],
)
def test_a_ciphertext_moved_to_another_row_is_corruption_naming_the_row(
    store_url: str, source: tuple[str, int], target: tuple[str, int]
) -> None:
    two_runs(store_url).close()
    move_body(store_url, source, target)
    with Store(store_url, codec=codec()) as store:
        with pytest.raises(
            StoreCorruptError, match=r"graphflow_messages row \(run 'r1', seq 1, column body\) does not open"
        ) as caught:
            store.load("r1")
        assert (caught.value.table, caught.value.run_id, caught.value.seq) == ("graphflow_messages", "r1", 1)
        assert store.load("r2").messages  # the other run is untouched


def test_a_ciphertext_moved_to_another_column_is_corruption_naming_the_row(store_url: str) -> None:
    store = two_runs(store_url)
    store.close()
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE graphflow_runs SET result = task WHERE run_id = 'r1'"))
    engine.dispose()
    with (
        Store(store_url, codec=codec()) as store,
        pytest.raises(
            StoreCorruptError, match=r"graphflow_runs row \(run 'r1', run, column result\) does not open"
        ),
    ):
        store.get_run("r1")


def test_a_truncated_ciphertext_is_corruption_and_nothing_runs_from_it(store_url: str) -> None:
    store = two_runs(store_url)
    store.close()
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        body = conn.execute(
            sa.text(
                "SELECT body, step_seq, published FROM graphflow_messages WHERE run_id = 'r1' AND seq = 2"
            )
        ).one()
        cut = body.body[:-8]
        conn.execute(
            sa.text("UPDATE graphflow_messages SET body = :b, checksum = :c WHERE run_id = 'r1' AND seq = 2"),
            {"b": cut, "c": message_sum("r1", 2, body.step_seq, body.published, cut)},
        )
    engine.dispose()
    with Store(store_url, codec=codec()) as store:
        a, b = Scripted("A"), Scripted("B")
        team = DurableGraphFlow([a, b], chain(a, b), store=store, run_id="r1")
        with pytest.raises(StoreCorruptError, match=r"run 'r1', seq 2, column body"):
            asyncio.run(team.run(task="more"))
        assert (a.turn, b.turn) == (0, 0)


def test_a_wrong_key_of_the_same_id_is_a_configuration_error_not_corruption(store_url: str) -> None:
    two_runs(store_url).close()
    with pytest.raises(StoreConfigError, match=r"key 'k1' is not the key this store's rows were sealed with"):
        Store(store_url, codec=codec({"k1": OTHER}))
    # k1 wrong but not the active key: the store opens, a k1 row is refused as a wrong key
    store = Store(store_url, codec=codec({"k1": OTHER, "k2": KEY}, active="k2"))
    with store, pytest.raises(StoreConfigError, match=r"key 'k1' is not the key"):
        store.load("r1")


def test_a_missing_key_is_a_configuration_error_naming_the_key_id(store_url: str) -> None:
    two_runs(store_url).close()
    with Store(store_url) as keyless, pytest.raises(StoreConfigError, match=r"sealed with key 'k1'"):
        keyless.load("r1")
    with Store(store_url) as keyless:  # the run's row is listed, its task marked, not opened
        assert keyless.get_run("r1").task == SealedValue("k1")  # type: ignore[union-attr]
    with (
        Store(store_url, codec=codec({"k2": OTHER})) as other,
        pytest.raises(StoreConfigError, match=r"sealed with key 'k1'"),
    ):
        other.load("r1")


def test_a_plain_row_is_refused_with_a_codec_unless_plaintext_is_allowed(store_url: str) -> None:
    with Store(store_url) as plain:
        a, b = Scripted("A"), Scripted("B")
        asyncio.run(DurableGraphFlow([a, b], chain(a, b), store=plain, run_id="p").run(task="plain"))
    with (
        Store(store_url, codec=codec()) as sealed,
        pytest.raises(StoreCorruptError, match="plain text in a store opened with a codec"),
    ):
        sealed.load("p")
    with Store(store_url, codec=codec(), allow_plaintext=True) as window:
        assert window.load("p").messages[0].body["content"] == "plain"
        # resumed in the window: what it writes now is sealed
        a, b = Scripted("A"), Scripted("B")
        asyncio.run(DurableGraphFlow([a, b], chain(a, b), store=window, run_id="p").run(task="SEALED-NOW"))
        assert window.load("p").messages[-3].body["content"] == "SEALED-NOW"
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        bodies = (
            conn.execute(sa.text("SELECT body FROM graphflow_messages WHERE run_id = 'p' ORDER BY seq"))
            .scalars()
            .all()
        )
    engine.dispose()
    assert [is_sealed(b) for b in bodies] == [False] * 3 + [True] * 3


def test_a_store_without_the_codec_never_writes_plain_content_into_a_sealed_run(store_url: str) -> None:
    store = Store(store_url, codec=codec())
    team = full_team(store)
    asyncio.run(team.run(task=TASK))
    assert store.get_run("full").status == "waiting"  # type: ignore[union-attr]
    store.close()
    with Store(store_url) as keyless:
        with pytest.raises(StoreConfigError, match=r"run 'full' holds sealed content.*answering"):
            keyless.respond("full", ANSWER)
        with pytest.raises(StoreConfigError, match=r"run 'full' holds sealed content.*driving"):
            keyless._driver.acquire_lease("full", "keyless", lease_seconds=30)
        with pytest.raises(StoreConfigError):
            asyncio.run(full_team(keyless).run())
    with Store(store_url, codec=codec()) as store:
        [request] = store.requests.of_run("full")
        assert request.status == "pending" and request.answer is None
        assert store.get_run("full").lease_owner is None  # type: ignore[union-attr]
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT sealed FROM graphflow_runs WHERE run_id = 'full'")).scalar_one()
    engine.dispose()


def test_racing_stores_keep_one_key_check_value(store_url: str) -> None:
    Store(store_url).close()  # the schema, made once
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: Store(store_url, codec=codec()), range(4)))
    for opened in stores:
        opened.close()
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key_id, check_value FROM graphflow_key_checks")).all()
    engine.dispose()
    assert [(k, v) for k, v in rows] == [("k1", codec().check_value("k1"))]


CRASH_WORKER = Path(__file__).resolve().parents[1] / "crash" / "worker.py"


@pytest.mark.parametrize("kill", ["agent:5", "commit:4:inside", "commit:7:after"])
def test_a_sealed_run_killed_resumes_exactly_as_a_plain_one(tmp_path: Path, kill: str) -> None:
    """The crash matrix's worker SIGKILLed at one point, then resumed in a fresh process, with and
    without the codec: the same transcript, and every stored body sealed."""
    keys = "k1=" + base64.b64encode(KEY).decode()
    outcome = {}
    for sealed in (False, True):
        url = f"sqlite:///{tmp_path / ('sealed' if sealed else 'plain')}.db"
        env = {"GRAPHFLOW_DURABLE_KEYS": keys} if sealed else {}
        log = tmp_path / f"{sealed}.log"
        killed = run_script(CRASH_WORKER, url, "crash-run", kill, exec_log=log, **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        outcome[sealed] = last_json(run_script(CRASH_WORKER, url, "crash-run", exec_log=log, **env))
    assert outcome[True] == outcome[False]
    assert outcome[True]["transcript"][-1][0] == "E"
    with sqlite3.connect(tmp_path / "sealed.db") as conn:
        bodies = [row[0] for row in conn.execute("SELECT body FROM graphflow_messages")]
        states = [row[0] for row in conn.execute("SELECT body FROM graphflow_agent_states")]
        deltas = conn.execute("SELECT count(*) FROM graphflow_agent_states WHERE base_step > 0").fetchone()
    assert bodies and states and all(is_sealed(b) for b in [*bodies, *states])
    assert deltas[0] > 0  # states saved as deltas (made on the plain JSON) were sealed and folded back


def test_verify_checks_a_sealed_store_without_keys_and_the_audit_opens_every_row(
    store_url: str,
) -> None:
    two_runs(store_url).close()
    with Store(store_url) as keyless:
        report = keyless.verify()
        assert report.ok and report.runs == ("r1", "r2") and report.checked > 0
    move_body(store_url, ("r2", 1), ("r1", 1))
    with Store(store_url) as keyless:
        assert keyless.verify().ok  # the checksum matches: only the seal can tell
    with Store(store_url, codec=codec()) as store:
        audit = store.audit_sealing(open_values=True)
    [damage] = audit.unopened
    assert (damage.run_id, damage.table, damage.position) == ("r1", "graphflow_messages", 1)
    assert "does not open" in damage.message


def test_a_worker_without_the_codec_claims_no_sealed_run_and_keeps_no_plain_error(store_url: str) -> None:
    with Store(store_url, codec=codec()) as store:
        asyncio.run(full_team(store).run(task=TASK))
        store.respond("full", ANSWER)
        assert store.get_run("full").status == "interrupted"  # type: ignore[union-attr]
    with Store(store_url) as keyless:
        with pytest.raises(StoreConfigError, match=r"run 'full' holds sealed content"):
            keyless.queue.claim("w1", lease_seconds=30)
        keyless.queue.record_failure("full", error=f"failed on {ANSWER}", retry_at=0.0)
    with Store(store_url, codec=codec()) as store:
        submitted = store.queue.get_submission("full")
        assert submitted is not None and submitted.attempts == 1 and submitted.last_error is None
        assert store.get_run("full").lease_owner is None  # type: ignore[union-attr]


def test_follow_and_the_pages_give_plain_text_only_with_the_keys(store_url: str) -> None:
    two_runs(store_url).close()

    async def followed(store: Store) -> list[Any]:
        return [m.body["content"] async for m in store.follow("r1", wait=False)]

    with Store(store_url, codec=codec()) as store:
        assert asyncio.run(followed(store))[0] == "t r1"
        assert {run.task[0]["content"] for run in store.list_runs_page().runs} == {"t r1", "t r2"}  # type: ignore[index]
    with Store(store_url) as keyless:
        with pytest.raises(StoreConfigError, match=r"sealed with key 'k1'"):
            asyncio.run(followed(keyless))
        assert {str(run.task) for run in keyless.list_runs_page().runs} == {"<sealed with key 'k1'>"}


def test_history_transcript_and_a_past_cut_open_sealed_rows(store_url: str) -> None:
    with two_runs(store_url) as store:
        assert store.transcript("r1")[0].body["content"] == "t r1"
        assert [info.seq for info in store.history("r1")] == [s.seq for s in store.load("r1").steps]
        assert store.cut("r1", 2).messages[0].body["content"] == "t r1"
