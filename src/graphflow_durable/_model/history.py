"""A run's history read from its step log: the steps in words, the thread filtered, and the run as it
stood at a past step (the *cut* that ``save_state(at=...)`` renders and a fork starts from).

Pure: works on the store's value objects (:class:`RunLog`, :class:`StepRecord`, :class:`StoredMessage`),
no I/O, no AutoGen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphflow_durable._model.records import RunLog, RunRecord, RunStatus, StepKind, StepRecord, StoredMessage
from graphflow_durable.errors import UsageError

__all__ = [
    "StepInfo",
    "check_step",
    "cut_record",
    "cut_status",
    "last_round_of",
    "message_nodes",
    "step_infos",
    "task_key_of",
    "transcript_of",
]

#: What is not part of a task's identity.
_VOLATILE = frozenset({"id", "created_at"})


@dataclass(frozen=True)
class StepInfo:
    """One committed step of a run, as ``history`` lists it.

    Attributes:
        seq: the step's number (1 is the run's creation; the run's head is the last).
        round: the round it belongs to: each step of kind ``start`` begins the next round (1, 2...);
            steps before the first round (the run's creation) are round 0.
        kind: what the step records (``created``, ``start``, ``input``, ``resume``, ``complete``,
            ``interrupt``, ``reset``, ``import``, ``wait``, ``attempt_failed``).
        node: the node whose answer a ``complete`` step records, or whose attempt an
            ``attempt_failed`` step records (else ``None``).
        attempt: for a ``complete`` step, which execution of that turn answered (1, or more when
            the node was in flight when the run was interrupted, or its attempt failed, and it ran
            again); for an ``attempt_failed`` step, the attempt that failed; else ``None``.
        time: when the step was committed (epoch seconds, the writer's clock).
        message_seqs: the seqs (positions in the run's thread) of the messages the step added.
        message_ids: the AutoGen ids (``message.id``) of those messages, where they have one.
        dispatched: the nodes the step selected to run next (or ran again, on a ``resume``).
        error_type, error, elapsed: for an ``attempt_failed`` step, the error's class name, its
            message and the seconds the attempt ran; else ``None``.
        supplied: a ``complete`` step whose answer an operator wrote (``Store.supply_output``) after
            the node's budget ran out: no attempt of the node produced it (``attempt`` is ``None``).
    """

    seq: int
    round: int
    kind: str
    node: str | None
    attempt: int | None
    time: float
    message_seqs: tuple[int, ...]
    message_ids: tuple[str, ...]
    dispatched: tuple[str, ...]
    error_type: str | None = None
    error: str | None = None
    elapsed: float | None = None
    supplied: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The step as JSON-ready values (the CLI's ``--json`` line)."""
        return {
            "seq": self.seq,
            "round": self.round,
            "kind": self.kind,
            "node": self.node,
            "attempt": self.attempt,
            "time": self.time,
            "message_seqs": list(self.message_seqs),
            "message_ids": list(self.message_ids),
            "dispatched": list(self.dispatched),
            **(
                {"error_type": self.error_type, "error": self.error, "elapsed": self.elapsed}
                if self.kind == StepKind.ATTEMPT_FAILED.value
                else {}
            ),
            **({"supplied": True} if self.supplied else {}),
        }


def _rounds(steps: Sequence[StepRecord]) -> dict[int, int]:
    rounds: dict[int, int] = {}
    current = 0
    for step in steps:
        if step.kind == StepKind.START:
            current += 1
        rounds[step.seq] = current
    return rounds


def step_infos(log: RunLog) -> list[StepInfo]:
    """Every step of ``log`` in order, with its round, attempt and messages."""
    by_step: dict[int, list[StoredMessage]] = {}
    for message in log.messages:
        by_step.setdefault(message.step_seq, []).append(message)
    rounds = _rounds(log.steps)
    attempts: dict[str, int] = {}
    infos = []
    for step in log.steps:
        data = step.data
        dispatched = tuple(str(n) for n in data.get("dispatched", ()))
        redispatched = tuple(str(n) for n in data.get("redispatched", ()))
        attempt = attempts.pop(step.node, 1) if step.kind == StepKind.COMPLETE and step.node else None
        failed = step.kind == StepKind.ATTEMPT_FAILED
        if failed:
            attempt = _int(data.get("attempt"))
        supplied = step.kind == StepKind.COMPLETE and data.get("supplied") is True
        if supplied:
            attempt = None
        for name in dispatched:
            attempts[name] = 1
        for name in redispatched:
            attempts[name] = attempts.get(name, 1) + 1
        added = by_step.get(step.seq, [])
        infos.append(
            StepInfo(
                seq=step.seq,
                round=rounds[step.seq],
                kind=StepKind(step.kind).value,
                node=step.node,
                attempt=attempt,
                time=step.created_at,
                message_seqs=tuple(m.seq for m in added),
                message_ids=tuple(str(m.body["id"]) for m in added if m.body.get("id") is not None),
                dispatched=dispatched or redispatched,
                error_type=str(data.get("error_type", "")) if failed else None,
                error=str(data.get("error", "")) if failed else None,
                elapsed=_number(data.get("elapsed")) if failed else None,
                supplied=supplied,
            )
        )
    return infos


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def message_nodes(log: RunLog) -> dict[int, str | None]:
    """Per message seq, the node whose answer added it (``None``: a task or user input)."""
    completes = {s.seq: s.node for s in log.steps if s.kind == StepKind.COMPLETE}
    return {m.seq: completes.get(m.step_seq) for m in log.messages}


def transcript_of(log: RunLog, round: int | None = None, node: str | None = None) -> list[StoredMessage]:
    """The run's thread in order, only round ``round`` and/or the answers of ``node`` if given."""
    rounds = _rounds(log.steps)
    nodes = message_nodes(log)
    return [
        m
        for m in log.messages
        if (round is None or rounds.get(m.step_seq) == round) and (node is None or nodes[m.seq] == node)
    ]


def last_round_of(log: RunLog) -> list[StoredMessage]:
    """The messages of ``log``'s last round (from its last ``start`` step on; the whole thread of a
    run with no round): what that round's ``TaskResult`` holds."""
    rounds = _rounds(log.steps)
    last = max(rounds.values(), default=0)
    return [m for m in log.messages if rounds.get(m.step_seq) == last]


def check_step(run: RunRecord, at: object) -> int:
    """``at`` if it is a step of ``run`` (1 to its head); else a one-line :class:`UsageError`."""
    if isinstance(at, bool) or not isinstance(at, int):
        raise UsageError(
            f"run {run.run_id}: step must be a whole number from 1 to {run.head_seq}, not {at!r}",
            run_id=run.run_id,
            option="at",
        )
    if not 1 <= at <= run.head_seq:
        raise UsageError(
            f"run {run.run_id} has steps 1 to {run.head_seq}; step {at} is out of range "
            f"(see its steps with 'graphflow-durable runs history {run.run_id}')",
            run_id=run.run_id,
            option="at",
        )
    return at


def cut_status(scheduler: Mapping[str, Any] | None) -> RunStatus:
    """The status a run has when its head is a step with this scheduler state (the cursor's JSON,
    ``_model.cursor.Cursor.to_json``): ``finished``/``stopped`` when its round ended, else
    ``interrupted`` (nobody drives it; ``run()`` resumes it)."""
    if scheduler is None or not scheduler.get("finished"):
        return "interrupted"
    return "stopped" if scheduler.get("stopped") else "finished"


def task_key_of(bodies: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What identifies a task, from its messages' dumps: the messages without their ids and
    timestamps (``_model.task.task_key`` applies it to message objects)."""
    return [{k: v for k, v in body.items() if k not in _VOLATILE} for body in bodies]


def cut_record(run: RunRecord, log: RunLog, at: int) -> RunRecord:
    """The run's row as it stood once step ``at`` was committed (``log``: the run read up to ``at``).

    Status from the step's scheduler state; the task of the round the step belongs to; the stop
    reason only when ``at`` is the head (earlier ones are not kept); no lease holder.
    """
    if at == run.head_seq:
        task, result = run.task, run.result
    else:
        task, result = None, None
        start = next((s for s in reversed(log.steps) if s.kind in (StepKind.START, StepKind.RESET)), None)
        if start is not None and start.kind == StepKind.START:
            task = task_key_of([m.body for m in log.messages if m.step_seq == start.seq])
        elif start is not None:
            task = []
    return replace(
        run,
        status=cut_status(log.scheduler),
        head_seq=at,
        message_count=len(log.messages),
        task=task,
        result=result,
        lease_owner=None,
        lease_expires_at=None,
        lease_host=None,
        lease_pid=None,
        lease_process=None,
    )
