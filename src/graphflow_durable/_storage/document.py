"""A run's export document (``Store.export_run`` / ``Store.import_run``; ``runs export`` /
``runs import``): the rows of :mod:`.transfer` as one JSON value, and every check an imported
document passes before anything is written.

An import refuses, naming the first bad field as a path (``steps[3].node``), a document that would
not resume as exported: a field of the wrong type, a time that is not a time, steps not numbered 1
to the run's head, messages not numbered 0 to its count or not in step order, a row referring to a
step the document does not hold, a ``complete`` step without its answer, an agent-state row that is
not JSON or does not fold into its node's state, JSON nested deeper than :data:`MAX_DEPTH` levels,
and (version 2) a row or run object that does not match its checksum. The checks that need AutoGen
(a message body through AutoGen's message factory, the head step's scheduler state through the
scheduler's parser) are :class:`ContentChecks` the package installs (:func:`use_content_checks`),
since storage never imports AutoGen.

Version 2 (written since this release) carries a checksum on the run object and on every step,
message and agent-state row: the store's row checksums (``_storage.checksum``) of the text an
import writes, under the exported run's id, so an export edited by hand is refused instead of
stored with fresh checksums. Version 1 (no checksums) is still read, with every check but those.

Version 3 is a sealed run written as stored (``runs export`` of a run with sealed content, without
``--decrypt``): every content value (``run.task``, ``run.result``, a step's ``data``, a message's
``body``, an agent-state body, a call record's ``result``) is the stored text, ``gfd1:...`` when
sealed (bound to the exported run's id) or plain JSON text, and each checksum covers those texts.
:func:`.sealedexport.unseal` turns it into version 2 with the importing store's keys, after checking those
checksums; the import then seals the rows with the target store's codec, for the run's new id.

``call_records`` (since schema version 12; a document without it holds none) carries the run's
recorded model and tool calls, each with its checksum (``checksum.call_sum``); a record's
``result`` is the stored JSON text, as an agent-state body is. Imported under a new run id, their
turn keys name the new run (``transfer.rekey_calls``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphflow_durable._agentstate.decoder import fold_states, references
from graphflow_durable._model.codec import dumps, loads, too_deep
from graphflow_durable._model.records import CALL_KINDS, CALL_OUTCOMES, RUN_STATUSES, StepKind, StoredMessage
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage.checksum import call_sum, message_sum, run_sum, state_sum, step_sum
from graphflow_durable._storage.sealing import is_sealed
from graphflow_durable._storage.transfer import RunRows, rekey_calls
from graphflow_durable.errors import NotSerializableError, StoreCorruptError, UsageError

__all__ = [
    "EXPORT_FORMAT",
    "MAX_DEPTH",
    "VERSION",
    "ContentChecks",
    "from_document",
    "to_document",
    "use_content_checks",
]

#: The ``format`` of an export document.
EXPORT_FORMAT = "graphflow-durable-run"
#: The ``version`` written (a sealed run as stored: :data:`SEALED_VERSION`); :func:`from_document`
#: reads 1 (no checksums) and 2, and 3 once ``sealedexport.unseal`` opened it.
VERSION = 2
SEALED_VERSION = 3
_READS = (1, 2)

#: How deep an export's JSON may nest (the document itself counts as level 1). Far above what
#: AutoGen's messages and states hold; a bound keeps an import clear of Python's recursion limit.
MAX_DEPTH = 500

#: The latest time a document may hold (9999-12-31T23:59:59Z): what the store's commands can show.
_LAST_TIME = 253402300799.0

_RUN_FIELDS = (
    "run_id",
    "graph_fingerprint",
    "status",
    "head_seq",
    "message_count",
    "parent_run_id",
    "created_at",
    "updated_at",
)
_JSON_FIELDS = ("graph", "task", "result")


@dataclass(frozen=True)
class ContentChecks:
    """The checks of a document's content that need AutoGen; each raises ``ValueError`` saying
    what is wrong (one line, no path).

    Attributes:
        message: checks a message body (a ``message.dump()``).
        graph: checks the run's graph description (``run.graph``).
        head: checks the head step's scheduler state against the run's graph description (which
            passed ``graph``).
    """

    message: Callable[[Mapping[str, Any]], None]
    graph: Callable[[Mapping[str, Any]], None]
    head: Callable[[Mapping[str, Any], Mapping[str, Any]], None]


_content: ContentChecks | None = None


def use_content_checks(checks: ContentChecks) -> None:
    """Install the AutoGen-side checks every later :func:`from_document` runs (the package does,
    in ``graphflow_durable/__init__.py``, so they are in place wherever the store is used)."""
    global _content
    _content = checks


class Bad(Exception):
    """A field of the document that is wrong: its path and what is wrong with it (raised here and
    by :mod:`.sealedexport`)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem


# -- export ------------------------------------------------------------------------------------


def to_document(rows: RunRows, schema_version: int) -> dict[str, Any]:
    """``rows`` as an export document (JSON columns decoded; agent-state bodies as their stored
    text), each row and the run object with its checksum. Rows holding sealed content make a
    version 3 document, every content value its stored text (see the module)."""
    sealed = any(is_sealed(value) for _, _, value in _contents(rows))
    text: Callable[[str | None], Any] = (
        (lambda v: v) if sealed else (lambda v: None if v is None else loads(v))
    )
    run_id = rows.run["run_id"]
    run: dict[str, Any] = {k: rows.run[k] for k in _RUN_FIELDS}
    run["graph"] = loads(rows.run["graph"])
    run.update({k: text(rows.run[k]) for k in ("task", "result")})
    run["checksum"] = run_sum(run)
    steps = []
    for s in rows.steps:
        scheduler, data = loads(s["scheduler"]), text(s["data"])
        # over the text an import writes (canonical JSON of the decoded value), not the stored text
        data_text = data if sealed else dumps(data)
        checksum = step_sum(run_id, s["seq"], s["kind"], s["node"], data_text, dumps(scheduler))
        steps.append({**s, "scheduler": scheduler, "data": data, "checksum": checksum})
    messages = []
    for m in rows.messages:
        body, published = text(m["body"]), bool(m["published"])
        checksum = message_sum(run_id, m["seq"], m["step_seq"], published, body if sealed else dumps(body))
        messages.append({**m, "published": published, "body": body, "checksum": checksum})
    states = [
        {**r, "checksum": state_sum(run_id, r["node"], r["step_seq"], r["base_step"], r["body"])}
        for r in rows.states
    ]
    calls = [{**c, "checksum": call_sum(run_id, c)} for c in rows.calls]
    return {
        "format": EXPORT_FORMAT,
        "version": SEALED_VERSION if sealed else VERSION,
        "schema_version": schema_version,
        "run": run,
        "steps": steps,
        "messages": messages,
        "agent_states": states,
        "call_records": calls,
    }


def _contents(rows: RunRows) -> list[tuple[str, str, str | None]]:
    """Every content value of ``rows``: (its table, its column, the value)."""
    found = [("graphflow_runs", k, rows.run[k]) for k in ("task", "result")]
    found += [("graphflow_steps", "data", s["data"]) for s in rows.steps]
    found += [("graphflow_messages", "body", m["body"]) for m in rows.messages]
    found += [("graphflow_agent_states", "body", r["body"]) for r in rows.states]
    return found + [("graphflow_call_records", "result", c["result"]) for c in rows.calls]


# -- import ------------------------------------------------------------------------------------


def from_document(doc: Any, where: str, run_id: str | None = None) -> RunRows:
    """The rows of an export document, as run ``run_id`` if given, every check passed (see the
    module). A run exported while ``running``, or ``waiting`` for a person, becomes
    ``interrupted``: its requests for human input are not exported, so a waiting node asks again.

    Raises:
        UsageError: ``{where}: {path}: {what is wrong}; nothing was imported (...)`` for the first bad
            field; or ``run_id`` is not a valid run id.
    """
    if run_id is not None:
        check_run_id(run_id, option="run_id")
    try:
        return _Reader(doc).rows(run_id)
    except Bad as bad:
        raise UsageError(
            f"{where}: {bad.path}: {bad.problem}; nothing was imported (import a document as "
            "export_run() or 'runs export' wrote it)",
            option="document",
        ) from None


def _path(keys: Sequence[str | int]) -> str:
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out or "the document"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Reader:
    """One document read and checked; raises :class:`Bad` at the first bad field."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc

    # -- field checks ------------------------------------------------------------------------

    def _object(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise Bad(path, f"is {_short(value)}, not a JSON object")
        return value

    def _list(self, value: Any, path: str) -> Sequence[Any]:
        if not isinstance(value, list):
            raise Bad(path, f"is {_short(value)}, not a JSON array")
        return value

    def _field(self, obj: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in obj:
            raise Bad(f"{path}.{key}", "is missing")
        return obj[key]

    def _int(self, value: Any, path: str, low: int = 0) -> int:
        if not _is_int(value):
            raise Bad(path, f"is {_short(value)}, not an integer")
        if value < low:
            raise Bad(path, f"is {value}, below {low}")
        return int(value)

    def _text(self, value: Any, path: str, *, optional: bool = False, empty: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not (value or empty):
            raise Bad(path, f"is {_short(value)}, not a {'' if empty else 'non-empty '}string")
        if "\x00" in value:
            raise Bad(path, "holds a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Bad(path, "holds a lone surrogate, which UTF-8 cannot encode") from None
        return value

    def _time(self, value: Any, path: str) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Bad(path, f"is {_short(value)}, not a time (seconds since the epoch)")
        if not math.isfinite(value) or not 0 <= value <= _LAST_TIME:
            raise Bad(path, f"is {value!r}, not a time between 1970 and 9999 (seconds since the epoch)")
        return float(value)

    def _json(self, value: Any, path: str) -> str:
        try:
            return dumps(value, where=path)
        except NotSerializableError as exc:
            raise Bad(path, f"cannot be stored as JSON ({exc})") from None

    def _checksum(self, obj: Mapping[str, Any], path: str, expected: int) -> None:
        if self.version < 2:
            return
        found = self._field(obj, "checksum", path)
        if not _is_int(found):
            raise Bad(f"{path}.checksum", f"is {_short(found)}, not an integer")
        if found != expected:
            raise Bad(
                path,
                "does not match its checksum: the document was changed after it was exported; "
                "export the run again instead of editing the export",
            )

    # -- the document ------------------------------------------------------------------------

    def rows(self, new_id: str | None) -> RunRows:
        doc = self.doc
        if not isinstance(doc, Mapping) or doc.get("format") != EXPORT_FORMAT:
            raise Bad("format", f'it is not a graphflow-durable run export (no "format": "{EXPORT_FORMAT}")')
        version = doc.get("version")
        if version not in _READS or not _is_int(version):
            raise Bad("version", f"is {_short(version)}; this release reads versions 1 and 2")
        self.version = int(version)
        deep = too_deep(doc, MAX_DEPTH)
        if deep is not None:  # the path to where it begins: hundreds of [0] say nothing more
            raise Bad(
                _path(deep[:8]) + "...",
                f"is nested deeper than {MAX_DEPTH} levels, the most an export may hold",
            )
        run = self._run(self._object(self._field(doc, "run", "the document"), "run"))
        self._graph_content()
        steps = self._list(self._field(doc, "steps", "the document"), "steps")
        messages = self._list(self._field(doc, "messages", "the document"), "messages")
        states = self._list(self._field(doc, "agent_states", "the document"), "agent_states")
        calls = self._list(doc.get("call_records", []), "call_records")  # absent: written before them
        rows = RunRows(
            run=run,
            steps=[self._step(s, f"steps[{i}]", i) for i, s in enumerate(steps)],
            messages=[self._message(m, f"messages[{i}]", i) for i, m in enumerate(messages)],
            states=[self._state(r, f"agent_states[{i}]") for i, r in enumerate(states)],
        )
        for i, c in enumerate(calls):
            rows.calls.append(self._call(c, f"call_records[{i}]", rows.calls[-1]["seq"] if rows.calls else 0))
        self._counts(rows)
        self._references(rows)
        self._fold(rows)
        self._head(rows)
        if new_id is not None:
            rows.run["run_id"] = new_id
            rows.calls = rekey_calls(rows.calls, self.run_id, new_id)
        if rows.run["status"] in ("running", "waiting"):
            rows.run["status"] = "interrupted"
        return rows

    def _run(self, src: Mapping[str, Any]) -> dict[str, Any]:
        fields = {k: self._field(src, k, "run") for k in (*_RUN_FIELDS, *_JSON_FIELDS)}
        run_id = self._text(fields["run_id"], "run.run_id")
        assert run_id is not None
        try:
            check_run_id(run_id, option="run_id")
        except UsageError as exc:
            raise Bad("run.run_id", str(exc)) from None
        self.run_id = run_id
        self._text(fields["graph_fingerprint"], "run.graph_fingerprint")
        if fields["status"] not in RUN_STATUSES:
            raise Bad("run.status", f"is {_short(fields['status'])}, not one of {', '.join(RUN_STATUSES)}")
        self.head = self._int(fields["head_seq"], "run.head_seq")
        self._int(fields["message_count"], "run.message_count")
        parent = self._text(fields["parent_run_id"], "run.parent_run_id", optional=True)
        if parent is not None:
            try:
                check_run_id(parent, option="parent_run_id")
            except UsageError as exc:
                raise Bad("run.parent_run_id", str(exc)) from None
        for key in ("created_at", "updated_at"):
            self._time(fields[key], f"run.{key}")
        self.graph = self._graph(fields["graph"])
        run = {k: fields[k] for k in _RUN_FIELDS}
        run.update(
            {k: None if fields[k] is None else self._json(fields[k], f"run.{k}") for k in _JSON_FIELDS}
        )
        self._checksum(src, "run", run_sum(fields))  # every field is JSON by now
        return run

    def _graph(self, value: Any) -> Mapping[str, Any]:
        graph = self._object(value, "run.graph")
        nodes = self._object(self._field(graph, "nodes", "run.graph"), "run.graph.nodes")
        for name, node in nodes.items():
            self._object(node, f"run.graph.nodes.{name}")
        self.nodes = frozenset(nodes)
        participants = self._list(self._field(graph, "participants", "run.graph"), "run.graph.participants")
        for i, name in enumerate(participants):
            self._text(name, f"run.graph.participants[{i}]")
        self.participants = frozenset(participants)
        return graph

    def _step(self, value: Any, path: str, index: int) -> dict[str, Any]:
        s = self._object(value, path)
        seq = self._int(self._field(s, "seq", path), f"{path}.seq", 1)
        if seq != index + 1:
            raise Bad(f"{path}.seq", f"is {seq}; the steps must be numbered 1, 2, 3... in order")
        kind = self._field(s, "kind", path)
        if not isinstance(kind, str) or kind not in {k.value for k in StepKind}:
            raise Bad(f"{path}.kind", f"is {_short(kind)}, not one of {', '.join(k.value for k in StepKind)}")
        node = self._text(
            self._field(s, "node", path), f"{path}.node", optional=kind != StepKind.COMPLETE.value
        )
        if node is not None and node not in self.nodes:
            raise Bad(f"{path}.node", f"{node!r} is not a node of the run's graph (run.graph.nodes)")
        scheduler = self._object(self._field(s, "scheduler", path), f"{path}.scheduler")
        data = self._object(self._field(s, "data", path), f"{path}.data")
        scheduler_text = self._json(scheduler, f"{path}.scheduler")
        data_text = self._json(data, f"{path}.data")
        created_at = self._time(self._field(s, "created_at", path), f"{path}.created_at")
        self._checksum(s, path, step_sum(self.run_id, seq, kind, node, data_text, scheduler_text))
        return {
            "seq": seq,
            "kind": kind,
            "node": node,
            "scheduler": scheduler_text,
            "data": data_text,
            "created_at": created_at,
        }

    def _message(self, value: Any, path: str, index: int) -> dict[str, Any]:
        m = self._object(value, path)
        seq = self._int(self._field(m, "seq", path), f"{path}.seq")
        if seq != index:
            raise Bad(f"{path}.seq", f"is {seq}; the messages must be numbered 0, 1, 2... in order")
        step_seq = self._int(self._field(m, "step_seq", path), f"{path}.step_seq", 1)
        published = self._field(m, "published", path)
        if not isinstance(published, bool):
            raise Bad(f"{path}.published", f"is {_short(published)}, not true or false")
        body = self._object(self._field(m, "body", path), f"{path}.body")
        text = self._json(body, f"{path}.body")
        self._checksum(m, path, message_sum(self.run_id, seq, step_seq, published, text))
        if _content is not None:
            try:
                _content.message(body)
            except ValueError as exc:
                raise Bad(f"{path}.body", str(exc)) from None
        return {"seq": seq, "step_seq": step_seq, "published": published, "body": text}

    def _state(self, value: Any, path: str) -> dict[str, Any]:
        r = self._object(value, path)
        node = self._text(self._field(r, "node", path), f"{path}.node")
        assert node is not None
        if node not in self.participants:
            raise Bad(f"{path}.node", f"{node!r} is not a participant of the run (run.graph.participants)")
        step_seq = self._int(self._field(r, "step_seq", path), f"{path}.step_seq", 1)
        base = self._field(r, "base_step", path)
        if base is not None and (self._int(base, f"{path}.base_step") >= step_seq):
            raise Bad(f"{path}.base_step", f"is {base}, not a step before the row's own ({step_seq})")
        body = self._text(self._field(r, "body", path), f"{path}.body")
        assert body is not None
        try:
            parsed = loads(body)
        except RecursionError:
            raise Bad(
                f"{path}.body", f"is nested deeper than {MAX_DEPTH} levels, the most an export may hold"
            ) from None
        except ValueError as exc:
            raise Bad(f"{path}.body", f"is not JSON text ({exc})") from None
        if too_deep(parsed, MAX_DEPTH) is not None:
            raise Bad(
                f"{path}.body", f"is nested deeper than {MAX_DEPTH} levels, the most an export may hold"
            )
        if base is not None and not isinstance(parsed, Mapping):
            raise Bad(f"{path}.body", "is a delta (base_step is set) but not a JSON object")
        row = {"node": node, "step_seq": step_seq, "base_step": base, "body": body}
        self._checksum(r, path, state_sum(self.run_id, node, step_seq, base, body))
        return row

    def _call(self, value: Any, path: str, previous: int) -> dict[str, Any]:
        c = self._object(value, path)
        row: dict[str, Any] = {}
        seq = row["seq"] = self._int(self._field(c, "seq", path), f"{path}.seq", 1)
        if seq <= previous:
            raise Bad(
                f"{path}.seq",
                f"is {seq}, not above the record before it ({previous}): records are in seq order",
            )
        for key in ("turn_key", "fingerprint"):
            row[key] = self._text(self._field(c, key, path), f"{path}.{key}")
        for key in ("name", "ident"):  # a tool's call id may be empty, as a model gave it
            row[key] = self._text(self._field(c, key, path), f"{path}.{key}", empty=True)
        node = row["node"] = self._text(self._field(c, "node", path), f"{path}.node")
        if node not in self.nodes:
            raise Bad(f"{path}.node", f"{node!r} is not a node of the run's graph (run.graph.nodes)")
        row["step"] = self._int(self._field(c, "step", path), f"{path}.step")
        if row["step"] > self.head:
            raise Bad(f"{path}.step", f"is {row['step']}, a step the document does not hold")
        row["attempt"] = self._int(self._field(c, "attempt", path), f"{path}.attempt")
        for key, allowed in (("kind", CALL_KINDS), ("outcome", CALL_OUTCOMES)):
            found = row[key] = self._field(c, key, path)
            if found not in allowed:
                raise Bad(f"{path}.{key}", f"is {_short(found)}, not one of {', '.join(allowed)}")
        result = row["result"] = self._text(
            self._field(c, "result", path), f"{path}.result", optional=True, empty=True
        )
        if (result is None) != (row["outcome"] == "replayed"):
            raise Bad(f"{path}.result", "must be JSON text on a live record and null on a replayed one")
        if result is not None:
            try:
                loads(result)
            except (ValueError, RecursionError) as exc:
                raise Bad(f"{path}.result", f"is not JSON text ({exc})") from None
        for key in ("prompt_tokens", "completion_tokens"):
            tokens = self._field(c, key, path)
            row[key] = None if tokens is None else self._int(tokens, f"{path}.{key}")
        discarded = row["discarded"] = self._field(c, "discarded", path)
        if not isinstance(discarded, bool):
            raise Bad(f"{path}.discarded", f"is {_short(discarded)}, not true or false")
        row["created_at"] = self._time(self._field(c, "created_at", path), f"{path}.created_at")
        self._checksum(c, path, call_sum(self.run_id, row))
        return row

    # -- between rows ------------------------------------------------------------------------

    def _counts(self, rows: RunRows) -> None:
        if len(rows.steps) != self.head:
            raise Bad("run.head_seq", f"is {self.head}, but the document holds {len(rows.steps)} steps")
        if len(rows.messages) != rows.run["message_count"]:
            raise Bad(
                "run.message_count",
                f"is {rows.run['message_count']}, but the document holds {len(rows.messages)} messages",
            )

    def _references(self, rows: RunRows) -> None:
        last = 0
        upto: dict[int, int] = {}  # per step that added messages: the thread's length after it
        for i, m in enumerate(rows.messages):
            if m["step_seq"] > self.head:
                raise Bad(f"messages[{i}].step_seq", f"is {m['step_seq']}, a step the document does not hold")
            if m["step_seq"] < last:
                raise Bad(
                    f"messages[{i}].step_seq",
                    f"is {m['step_seq']}, before the step of the message before it ({last}): "
                    "the thread must follow the steps",
                )
            last = m["step_seq"]
            upto[last] = i + 1
        length = 0
        for i, s in enumerate(self.doc["steps"]):
            length = upto.get(i + 1, length)
            # A step that dispatched nodes recorded the thread's length then ("at", counted from
            # the cursor's origin): the messages up to it must number as many, or one was removed
            # (a node would resume without an answer it saw) or added.
            at, origin = s["data"].get("at"), s["scheduler"].get("origin")
            if _is_int(at) and _is_int(origin) and origin + at != length:
                raise Bad(
                    f"steps[{i}]",
                    f"says the thread held {origin + at} messages after step {i + 1}, but the document "
                    f"holds {length} up to it: a message is missing (or was added)",
                )
        seen: set[tuple[str, int]] = set()
        for i, r in enumerate(rows.states):
            if r["step_seq"] > self.head:
                raise Bad(
                    f"agent_states[{i}].step_seq", f"is {r['step_seq']}, a step the document does not hold"
                )
            if (r["node"], r["step_seq"]) in seen:
                raise Bad(
                    f"agent_states[{i}]", f"is a second state of node {r['node']!r} at step {r['step_seq']}"
                )
            seen.add((r["node"], r["step_seq"]))

    def _fold(self, rows: RunRows) -> None:
        """Fold every agent-state row into its node's state, as a resume (or a fork at any step)
        reads them; a row that does not fit is refused here, not found by a resume."""
        order = sorted(
            range(len(rows.states)), key=lambda i: (rows.states[i]["node"], rows.states[i]["step_seq"])
        )
        at = {(rows.states[i]["node"], rows.states[i]["step_seq"]): i for i in order}
        thread = [
            StoredMessage(m["seq"], m["step_seq"], self.doc["messages"][i]["body"], m["published"])
            for i, m in enumerate(rows.messages)
        ]
        states = [rows.states[i] for i in order]
        try:
            fold_states(
                self.run_id,
                [(r["node"], r["step_seq"], r["base_step"], r["body"]) for r in states],
                references(thread),
            )
        except StoreCorruptError as exc:
            index = at.get((str(exc.node), exc.step or 0))
            path = "agent_states" if index is None else f"agent_states[{index}]"
            raise Bad(
                path,
                f"does not fold into the state of node {exc.node!r}: its base_step, kind or splice does "
                "not fit the node's previous row",
            ) from None
        except RecursionError:
            raise Bad(
                "agent_states",
                f"a node's state is nested deeper than {MAX_DEPTH} levels, the most an export may hold",
            ) from None

    def _graph_content(self) -> None:
        if _content is not None:
            try:
                _content.graph(self.graph)
            except ValueError as exc:
                raise Bad("run.graph", str(exc)) from None

    def _head(self, rows: RunRows) -> None:
        if _content is not None and rows.steps:
            try:
                _content.head(self.doc["steps"][-1]["scheduler"], self.graph)
            except ValueError as exc:
                raise Bad(f"steps[{len(rows.steps) - 1}].scheduler", str(exc)) from None
