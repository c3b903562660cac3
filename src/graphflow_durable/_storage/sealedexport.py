"""A sealed run's export document (version 3, ``runs export`` of a sealed run without
``--decrypt``) opened for an import: each checksum checked over the stored texts the document
holds, each sealed value opened with the importing store's keys for the exported run's id (the
associated data it was sealed with), and the document rewritten as version 2, plain, with its
checksums computed again, for :func:`.document.from_document`'s checks. The import then seals the
rows with the target store's codec for the run's (possibly new) id (``transfer.write_rows``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from graphflow_durable._model.codec import dumps, loads
from graphflow_durable._storage.checksum import call_sum, message_sum, run_sum, state_sum, step_sum
from graphflow_durable._storage.document import SEALED_VERSION, VERSION, Bad
from graphflow_durable._storage.sealing import Sealer, is_sealed
from graphflow_durable.errors import StoreCorruptError, UsageError

__all__ = ["unseal"]


def unseal(doc: Any, sealer: Sealer, where: str) -> Any:
    """A version 3 document (a sealed run as stored) as version 2: each checksum checked over the
    stored texts, each sealed value opened with ``sealer``'s keys (for the exported run's id) and
    the checksums computed again over the plain values. Any other document is returned as it is;
    a field of the wrong shape is left for :func:`from_document` to name.

    Raises:
        UsageError: a row does not match its checksum, or a sealed value does not open.
        StoreConfigError: a value is sealed with a key ``sealer`` lacks (the error names its id).
    """
    if not isinstance(doc, Mapping) or doc.get("version") != SEALED_VERSION:
        return doc
    try:
        return _Unsealer(doc, sealer).document()
    except Bad as bad:
        raise UsageError(
            f"{where}: {bad.path}: {bad.problem}; nothing was imported (import a document as "
            "export_run() or 'runs export' wrote it)",
            option="document",
        ) from None


class _Unsealer:
    """One version 3 document opened (see :func:`unseal`)."""

    def __init__(self, doc: Mapping[str, Any], sealer: Sealer) -> None:
        self.doc, self.sealer = doc, sealer
        run = doc.get("run")
        found = run.get("run_id") if isinstance(run, Mapping) else None
        self.run_id: str = found if isinstance(found, str) else ""

    def _open(self, value: Any, path: str, table: str, position: str | int, column: str) -> Any:
        """A content value as plain JSON text (``None`` kept; not text: left as it is)."""
        if not isinstance(value, str) or not is_sealed(value):
            return value
        try:
            return self.sealer.open(value, table, self.run_id, position, column)
        except StoreCorruptError:
            raise Bad(path, "does not open under its key: it was changed or moved from another row") from None

    def _sum(self, obj: Mapping[str, Any], path: str, expected: Callable[[], int]) -> None:
        try:
            right = obj.get("checksum") == expected()
        except (KeyError, TypeError, AttributeError, ValueError):
            return  # a field of the wrong shape: from_document names it
        if not right:
            raise Bad(path, "does not match its checksum: the document was changed after it was exported")

    def document(self) -> dict[str, Any]:
        doc = dict(self.doc)
        run = doc.get("run")
        if isinstance(run, Mapping):
            fields = {k: v for k, v in run.items() if k != "checksum"}
            self._sum(run, "run", lambda: run_sum(fields))
            for k in ("task", "result"):
                if isinstance(fields.get(k), str):
                    opened = self._open(fields[k], f"run.{k}", "graphflow_runs", "run", k)
                    fields[k] = _loads(opened, f"run.{k}")
            doc["run"] = {**fields, "checksum": _try(lambda: run_sum(fields))}
        for key, change in (
            ("steps", self._step),
            ("messages", self._message),
            ("agent_states", self._state),
            ("call_records", self._call),
        ):
            found = doc.get(key)
            if isinstance(found, list):  # a row of the wrong shape is kept: from_document names it
                doc[key] = [
                    change(row, f"{key}[{i}]") if isinstance(row, Mapping) else row
                    for i, row in enumerate(found)
                ]
        doc["version"] = VERSION
        return doc

    def _step(self, s: Mapping[str, Any], path: str) -> dict[str, Any]:
        run_id = self.run_id

        def checksum(r: Mapping[str, Any], data: str) -> int:
            return step_sum(run_id, r["seq"], r["kind"], r["node"], data, dumps(r["scheduler"]))

        self._sum(s, path, lambda: checksum(s, s["data"]))
        data = s.get("data")
        if isinstance(data, str):
            opened = self._open(data, f"{path}.data", "graphflow_steps", s.get("seq", 0), "data")
            data = _loads(opened, f"{path}.data")
        new = {**s, "data": data}
        new["checksum"] = _try(lambda: checksum(new, dumps(new["data"])))
        return new

    def _message(self, m: Mapping[str, Any], path: str) -> dict[str, Any]:
        run_id = self.run_id

        def checksum(r: Mapping[str, Any], body: str) -> int:
            return message_sum(run_id, r["seq"], r["step_seq"], r["published"], body)

        self._sum(m, path, lambda: checksum(m, m["body"]))
        body = m.get("body")
        if isinstance(body, str):
            opened = self._open(body, f"{path}.body", "graphflow_messages", m.get("seq", 0), "body")
            body = _loads(opened, f"{path}.body")
        new = {**m, "body": body}
        new["checksum"] = _try(lambda: checksum(new, dumps(new["body"])))
        return new

    def _state(self, r: Mapping[str, Any], path: str) -> dict[str, Any]:
        run_id = self.run_id

        def checksum(row: Mapping[str, Any]) -> int:
            return state_sum(run_id, row["node"], row["step_seq"], row["base_step"], row["body"])

        self._sum(r, path, lambda: checksum(r))
        place = f"{r.get('node')}@{r.get('step_seq')}"
        body = self._open(r.get("body"), f"{path}.body", "graphflow_agent_states", place, "body")
        new = {**r, "body": body}
        new["checksum"] = _try(lambda: checksum(new))
        return new

    def _call(self, c: Mapping[str, Any], path: str) -> dict[str, Any]:
        run_id = self.run_id
        self._sum(c, path, lambda: call_sum(run_id, c))
        result = self._open(
            c.get("result"), f"{path}.result", "graphflow_call_records", c.get("seq", 0), "result"
        )
        new = {**c, "result": result}
        new["checksum"] = _try(lambda: call_sum(run_id, new))
        return new


def _loads(text: Any, path: str) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return loads(text)
    except (ValueError, RecursionError) as exc:
        raise Bad(path, f"is not JSON text once opened ({exc})") from None


def _try(compute: Callable[[], int]) -> int | None:
    try:
        return compute()
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
