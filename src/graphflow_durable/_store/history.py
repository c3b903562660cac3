"""Store methods: a run's history and transcript, the run at a past step (cut), its fork, and a run
exported to a JSON document and imported back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphflow_durable._model.history import StepInfo, step_infos, transcript_of
from graphflow_durable._model.records import RunLog, RunRecord, StoredMessage
from graphflow_durable._storage.document import from_document, to_document
from graphflow_durable._storage.history import fork_run, read_cut
from graphflow_durable._storage.migrations import current_version
from graphflow_durable._storage.transfer import read_rows, write_rows
from graphflow_durable._store.runs import RunMethods

__all__ = ["HistoryMethods"]


class HistoryMethods(RunMethods):
    """History, time travel, fork, export and import (built on :meth:`load`)."""

    def history(self, run_id: str, *, round: int | None = None, node: str | None = None) -> list[StepInfo]:
        """The run's steps in order (:class:`StepInfo`: seq, round, kind, node, attempt, time, the
        messages each added), only those of round ``round`` and/or node ``node`` if given. Read
        with every row checked, as :meth:`load` reads.

        Raises:
            RunNotFoundError: no such run.
        """
        infos = step_infos(self.load(run_id))
        return [i for i in infos if (round is None or i.round == round) and (node is None or i.node == node)]

    def transcript(
        self, run_id: str, *, round: int | None = None, node: str | None = None
    ) -> list[StoredMessage]:
        """The run's thread (message dumps) in order, only round ``round`` (see :meth:`history`)
        and/or the answers of node ``node`` if given. :meth:`DurableGraphFlow.transcript` gives them
        as AutoGen message objects.

        Raises:
            RunNotFoundError: no such run.
        """
        return transcript_of(self.load(run_id), round, node)

    def cut(self, run_id: str, at: int) -> RunLog:
        """The run as it stood once step ``at`` was committed: its steps, messages and agent states
        up to that step, the step's scheduler state, and the run's row as it was then (status from
        the step; the stop reason only at the head). What ``save_state(at=...)`` renders and
        :meth:`fork` starts from. Read in one transaction, every row checked.

        Raises:
            RunNotFoundError: no such run.
            UsageError: ``at`` is not one of the run's steps (1 to its head).
        """
        with self._guard(f"reading run {run_id} at step {at}", run_id), self._e.read.begin() as conn:
            return read_cut(conn, run_id, at, self._e.url)

    def fork(
        self,
        run_id: str,
        at: int,
        *,
        new_run_id: str | None = None,
        replace: tuple[int, Mapping[str, Any]] | None = None,
    ) -> RunRecord:
        """Start a new run from the cut at step ``at`` of ``run_id``; return the new run's row.

        The new run (id ``new_run_id``, default ``"<run_id>-fork-<8 hex digits>"``) holds a copy of
        the source's steps, messages and agent states up to ``at`` (the source is only read), its
        ``parent_run_id`` is ``run_id``, nobody holds its lease (its fencing token is a new one, as
        every run's), and its status is the step's:
        ``interrupted`` mid-round (``run()`` with no task, on a team built with
        ``run_id=new_run_id``, resumes it: the nodes in flight at that step run again, then what
        follows), ``stopped`` or ``finished`` when the step ended its round. One transaction.

        ``replace=(seq, message)`` ("the node should have said this"): message ``seq`` of the cut,
        a node's text answer, is replaced by ``message`` (a dump whose ``source`` is that node), and
        the new run starts just after the step that recorded the answer: everything after it runs
        again. That step's scheduler state is kept, so the answer must not have decided anything
        there: refused when the node's edges have conditions or the step ended the round. In the
        node's own state saved at that turn, the old answer's text is replaced by the new one. The
        termination condition is not asked again about the batch the answer belonged to.

        Raises:
            RunNotFoundError: no such run.
            UsageError: ``at`` is out of range, ``new_run_id`` is not a valid run id, or the
                replacement is refused (see above).
            RunLockedError: ``at`` is the head of a run a live process drives (its nodes in flight
                are running there); fork at an earlier step, or once the run has ended.
            ConflictError: a run ``new_run_id`` exists already.
        """
        with self._guard(f"forking run {run_id} at step {at}", run_id), self._e.write.begin() as conn:
            return fork_run(conn, run_id, at, new_run_id, self._e.url, replace)

    def export_run(self, run_id: str) -> dict[str, Any]:
        """The run as one JSON document: its row (without the lease), steps, messages and agent-state
        rows, read in one transaction with every row checked. :meth:`import_run` reads it back,
        into this store or another (SQLite or PostgreSQL). The document (``"version": 2``) carries a
        checksum on the run object and on every row, so an edited export is refused on import.

        Raises:
            RunNotFoundError: no such run.
            StoreCorruptError: a row does not match its checksum.
        """
        with self._guard(f"exporting run {run_id}", run_id), self._e.read.begin() as conn:
            return to_document(read_rows(conn, run_id, self._e.url), current_version(conn) or 0)

    def import_run(self, document: Mapping[str, Any], *, run_id: str | None = None) -> RunRecord:
        """Write a run exported by :meth:`export_run` (as ``run_id`` if given) in one transaction;
        return its row. Nobody holds its lease, and its fencing token is a new one (a driver the
        exported run still had can never commit to it); a run exported while ``running`` (or
        ``waiting`` for a person: its requests are not exported, the node asks again) is imported
        as ``interrupted``, so ``run()`` resumes it here.

        The whole document is checked before anything is written (see ``_storage/document.py``):
        field types, times, numbering, references between steps and messages, every message body
        through AutoGen's message factory, the head's scheduler state through the scheduler's
        parser, agent-state rows folded, nesting depth (at most 500 levels) and, in a version 2
        document, every checksum (a version 1 document has none). The run is also read back before
        the transaction commits, as a resume reads it.

        Raises:
            UsageError: the document is not a run export or fails a check (the message names the
                first bad field as a path: ``steps[3].node``); ``run_id`` is not a valid run id.
            ConflictError: a run with its id exists already in this store.
        """
        rows = from_document(document, "the document", run_id)
        new_id = rows.run["run_id"]
        with self._guard(f"importing run {new_id}", new_id), self._e.write.begin() as conn:
            return write_rows(conn, rows, rows.run, self._e.url).run
