"""``Store.import_run`` and ``graphflow-durable runs import`` check the whole export document before
writing anything, on SQLite and PostgreSQL: a document that would crash the import or not resume as
exported is refused with one ``UsageError`` line naming its first bad field (CLI: exit 2), and the
run does not exist afterwards; an export carries its rows' checksums, so an edited export is refused.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents import Gate, Scripted, chain, close_stores, durable, stored_transcript
from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE, main
from graphflow_durable.errors import UsageError
from graphflow_durable.store import Store

Doc = dict[str, Any]


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _team(url: str | Store, run_id: str, gate: Gate | None = None) -> Any:
    a, b, c = Scripted("A"), Scripted("B", before=gate), Scripted("C")
    return durable([a, b, c], chain(a, b, c), url, run_id)


@pytest.fixture
async def exported(store_url: str) -> Doc:
    """The export of a finished run A -> B -> C (steps: created, start, A, B, C; 4 messages)."""
    team = _team(store_url, "source")
    await team.run(task="go")
    document: Doc = json.loads(json.dumps(team.store.export_run("source")))  # through a file's text
    return document


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _unsigned(doc: Doc) -> Doc:
    """``doc`` as a version 1 export (no checksums): what an edit has to pass besides checksums."""
    doc = copy.deepcopy(doc)
    doc["version"] = 1
    for row in (doc["run"], *doc["steps"], *doc["messages"], *doc["agent_states"]):
        row.pop("checksum", None)
    return doc


def _drop_answer(doc: Doc) -> None:
    """Remove B's answer (message 2) and renumber the thread: step 4 loses its message."""
    del doc["messages"][2]
    for seq, message in enumerate(doc["messages"]):
        message["seq"] = seq
    doc["run"]["message_count"] -= 1


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


# Each bad document: an edit of a good (unsigned) export, and the path the refusal names.
BAD: dict[str, tuple[Callable[[Doc], None], str]] = {
    "a step's node is a number": (_set(("steps", 2, "node"), 5), "steps[2].node"),
    "an agent-state body is not JSON": (
        _set(("agent_states", 0, "body"), "{not json"),
        "agent_states[0].body",
    ),
    "deeply nested JSON": (
        _set(("messages", 1, "body", "metadata"), _nested(100_000)),
        "messages[1].body.metadata[0][0][0][0]...",
    ),
    "a run time that is not a time": (_set(("run", "created_at"), "yesterday"), "run.created_at"),
    "a step time out of range": (_set(("steps", 1, "created_at"), 1e300), "steps[1].created_at"),
    "a run row the schema refuses": (_set(("run", "graph_fingerprint"), None), "run.graph_fingerprint"),
    "a message body that is not a message dump": (
        _set(("messages", 1, "body"), {"hello": "world"}),
        "messages[1].body",
    ),
    "a message AutoGen cannot load": (
        _set(("messages", 1, "body"), {"type": "TextMessage", "source": "A"}),
        "messages[1].body",
    ),
    "a head scheduler that is not a scheduler": (
        _set(("steps", 4, "scheduler"), {"ready": 7}),
        "steps[4].scheduler",
    ),
    "a head scheduler naming an unknown node": (
        _set(("steps", 4, "scheduler", "s", "ready"), ["Z"]),
        "steps[4].scheduler",
    ),
    "a step whose message is missing": (_drop_answer, "steps[3]"),
    "a message of a step the document does not hold": (
        _set(("messages", 3, "step_seq"), 9),
        "messages[3].step_seq",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_import_run_refuses_a_bad_document_naming_its_first_bad_field_and_writes_nothing(
    store_url: str, exported: Doc, case: str
) -> None:
    edit, path = BAD[case]
    document = _unsigned(exported)
    edit(document)
    with Store(store_url) as store:
        with pytest.raises(UsageError) as refused:
            store.import_run(document, run_id="copy")
        message = str(refused.value)
        assert message.startswith(f"the document: {path}: "), message
        assert "; nothing was imported (import a document as" in message and "\n" not in message
        assert store.get_run("copy") is None
        assert [r.run_id for r in store.list_runs()] == ["source"]


@pytest.mark.parametrize("case", list(BAD))
async def test_runs_import_refuses_a_bad_document_with_one_line_and_exit_2_and_writes_nothing(
    store_url: str, exported: Doc, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, path = BAD[case]
    document = _unsigned(exported)
    deep = case == "deeply nested JSON"
    if deep:  # json.dumps cannot write it: the file's text is made by hand, as an attacker would
        document["messages"][1]["body"]["metadata"] = "DEEP"
        text = json.dumps(document).replace('"DEEP"', "[" * 100_000 + "]" * 100_000)
    else:
        edit(document)
        text = json.dumps(document)
    file = tmp_path / "bad.json"
    file.write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert main(["runs", "import", "--store", store_url, str(file), "--run-id", "copy"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    # the parser's own limit is met before the document is read: the file is named, with the limit
    assert (
        f"FILE {file}: JSON nested more than 500 levels deep (the limit)" if deep else f"{path}: "
    ) in err, err
    with Store(store_url) as store:
        assert store.get_run("copy") is None


async def test_import_refuses_json_nested_deeper_than_the_limit_that_json_itself_can_parse(
    store_url: str, exported: Doc
) -> None:
    document = _unsigned(exported)
    document["steps"][2]["data"]["deep"] = _nested(600)  # within the parser's reach, beyond the limit
    document = json.loads(json.dumps(document))
    with Store(store_url) as store:
        with pytest.raises(
            UsageError,
            match=r"steps\[2\]\.data\.deep\[0\]\[0\]\[0\]\[0\]\.\.\.: is nested deeper than 500 levels",
        ):
            store.import_run(document, run_id="copy")
        assert store.get_run("copy") is None


async def test_an_edited_export_is_refused_by_its_checksums_on_both_paths(
    store_url: str, exported: Doc, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exported["version"] == 2
    assert all(isinstance(m["checksum"], int) for m in exported["messages"])
    edited = copy.deepcopy(exported)
    edited["messages"][2]["body"]["content"] = "B approved it"  # a well-formed, plausible edit
    with Store(store_url) as store:
        with pytest.raises(UsageError, match=r"^the document: messages\[2\]: does not match its checksum"):
            store.import_run(edited, run_id="copy")
        retitled = copy.deepcopy(exported)
        retitled["run"]["status"] = "interrupted"  # the run object is signed too
        with pytest.raises(UsageError, match=r"^the document: run: does not match its checksum"):
            store.import_run(retitled, run_id="copy")
        assert store.get_run("copy") is None
    file = tmp_path / "edited.json"
    file.write_text(json.dumps(edited), encoding="utf-8")
    capsys.readouterr()
    assert main(["runs", "import", "--store", store_url, str(file), "--run-id", "copy"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "messages[2]: does not match its checksum" in err, err


async def test_an_export_imported_under_another_id_resumes_where_it_was_interrupted(store_url: str) -> None:
    gate = Gate(turn=1)
    team = _team(store_url, "moving", gate)
    task = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    document = json.loads(json.dumps(team.store.export_run("moving")))
    assert document["version"] == 2
    imported = team.store.import_run(document, run_id="copy")
    assert imported.status == "interrupted"
    there = _team(team.store, "copy")
    await there.run()
    assert [source for source, _ in stored_transcript(there)] == ["user", "A", "B", "C"]
    assert there.run_info().status == "finished"


async def test_an_old_export_without_checksums_still_imports_and_resumes(
    store_url: str, exported: Doc, tmp_path: Path
) -> None:
    file = tmp_path / "old.json"
    file.write_text(json.dumps(_unsigned(exported)), encoding="utf-8")
    assert main(["runs", "import", "--store", store_url, str(file), "--run-id", "old"]) == EXIT_OK
    with Store(store_url) as store:
        assert store.get_run("old") is not None and store.get_run("old").status == "finished"  # type: ignore[union-attr]
        assert [m.body["source"] for m in store.transcript("old")] == ["user", "A", "B", "C"]
