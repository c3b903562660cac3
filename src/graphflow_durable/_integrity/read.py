"""Reading a saved team state for the integrity checks: shape, versions, messages.

Pure: turns a ``TeamState`` mapping into a :class:`Parsed` value and the findings about its
shape, without a graph. See :mod:`graphflow_durable.integrity` for the finding codes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, MessageFactory

from graphflow_durable._integrity.codes import Finding, finding, pointer
from graphflow_durable._model.records import RUN_STATUSES
from graphflow_durable.errors import GraphflowDurableError, StateFormatError
from graphflow_durable.scheduler import SchedulerState

__all__ = ["MANAGER", "Parsed", "parse"]

MANAGER = "GraphManager"
"""The ``agent_states`` key of GraphFlow's manager (``group_chat_manager_name``)."""

TEAM_VERSIONS = ("1.0.0",)
DURABLE_FORMATS = (1,)
MANAGER_TYPES = ("GraphManagerState",)
M = pointer("agent_states", MANAGER)


@dataclass
class Parsed:
    """What could be read from a state. ``None`` marks a field that is missing or malformed."""

    findings: list[Finding] = field(default_factory=list)
    refusal: GraphflowDurableError | None = None
    """The first problem repair cannot get past (wrong shape, unknown version, bad message)."""
    agent_states: Mapping[str, Any] = field(default_factory=dict)
    manager: Mapping[str, Any] = field(default_factory=dict)
    participants: tuple[str, ...] = ()
    thread: list[BaseAgentEvent | BaseChatMessage] | None = None
    thread_dumps: list[Mapping[str, Any]] = field(default_factory=list)
    ready: list[str] | None = None
    remaining: dict[str, dict[str, int]] | None = None
    enqueued_any: dict[str, dict[str, bool]] | None = None
    turn: int | None = None
    ext: Mapping[str, Any] | None = None
    ext_sched: SchedulerState | None = None

    @property
    def legacy(self) -> bool:
        return self.ext is None

    def add(self, code: str, where: str, message: str) -> None:
        self.findings.append(finding(code, where, message))

    def refuse(self, code: str, where: str, message: str) -> None:
        self.add(code, where, message)
        if self.refusal is None:
            self.refusal = StateFormatError(f"{where or '/'}: {message}", code=code, pointer=where or "/")


def parse(state: Any) -> Parsed:
    """Read ``state``; shape and version problems become findings (and a refusal if fatal)."""
    p = Parsed()
    if not isinstance(state, Mapping) or not isinstance(state.get("agent_states"), Mapping):
        p.refuse(
            "GFD001-not-a-team-state",
            "",
            "not a team state: expected a JSON object with an 'agent_states' object, "
            "as GraphFlow.save_state() writes",
        )
        return p
    _read_team_header(p, state)
    p.agent_states = state["agent_states"]
    manager = p.agent_states.get(MANAGER)
    if not isinstance(manager, Mapping):
        p.refuse(
            "GFD004-manager-missing",
            pointer("agent_states", MANAGER),
            f"no {MANAGER!r} entry in agent_states: this is not a GraphFlow team state",
        )
        return p
    p.manager = manager
    kind = manager.get("type")
    if kind is not None and kind not in MANAGER_TYPES:
        p.refuse(
            "GFD005-not-a-graphflow-state",
            M + "/type",
            f"the manager state has type {kind!r}; a GraphFlow manager has {MANAGER_TYPES[0]!r} (or none)",
        )
        return p
    _read_participants(p)
    _read_thread(p)
    _read_plain_scheduler(p)
    _read_extension(p)
    return p


def _read_team_header(p: Parsed, state: Mapping[str, Any]) -> None:
    kind, version = state.get("type"), state.get("version")
    if kind is not None and kind != "TeamState":
        p.refuse("GFD003-version-unknown", "/type", f"type is {kind!r}, expected 'TeamState'")
    if version is None or kind is None:
        missing = " and ".join(k for k, v in (("type", kind), ("version", version)) if v is None)
        p.add(
            "GFD002-version-missing",
            "/version" if version is None else "/type",
            f"the team state has no {missing}; repair writes type 'TeamState', version '1.0.0'",
        )
    elif version not in TEAM_VERSIONS:
        p.refuse(
            "GFD003-version-unknown",
            "/version",
            f"team state version {version!r} is not one this package reads ({', '.join(TEAM_VERSIONS)}); "
            "states saved before autogen-agentchat 0.4.9 must be re-saved with a newer AutoGen",
        )


def _read_participants(p: Parsed) -> None:
    names: list[str] = []
    for name, entry in p.agent_states.items():
        if name == MANAGER:
            continue
        where = pointer("agent_states", name)
        if not isinstance(entry, Mapping) or not isinstance(entry.get("agent_state", {}), Mapping):
            p.refuse("GFD008-bad-shape", where, f"participant {name!r}: expected a ChatAgentContainerState")
            continue
        names.append(name)
        for key in ("message_buffer", "deferred_buffer"):
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(m, Mapping) for m in value):
                p.add(
                    "GFD008-bad-shape",
                    f"{where}/{key}",
                    f"{key} must be a list of messages; repair rebuilds it",
                )
    p.participants = tuple(names)


def _read_thread(p: Parsed) -> None:
    thread = p.manager.get("message_thread")
    if not isinstance(thread, list):
        p.refuse("GFD008-bad-shape", M + "/message_thread", "message_thread is missing or not a list")
        return
    factory = MessageFactory()
    messages: list[BaseAgentEvent | BaseChatMessage] = []
    for index, dump in enumerate(thread):
        try:
            if not isinstance(dump, Mapping):
                raise TypeError(f"a {type(dump).__name__}, not a message object")
            messages.append(factory.create(dump))
        except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
            reason = str(exc).splitlines()[0]
            p.refuse(
                "GFD009-bad-message",
                f"{M}/message_thread/{index}",
                f"message {index} of the thread is not a message AutoGen can read: {reason}",
            )
            return
    p.thread = messages
    p.thread_dumps = list(thread)


def _str_list(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _nested(value: Any, kind: type) -> dict[str, dict[str, Any]] | None:
    if not isinstance(value, Mapping):
        return None
    out: dict[str, dict[str, Any]] = {}
    for target, groups in value.items():
        if not isinstance(groups, Mapping):
            return None
        inner: dict[str, Any] = {}
        for group, item in groups.items():
            # bool is an int subclass: a count must not be a flag, nor a flag a count.
            if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
                return None
            inner[str(group)] = item
        out[str(target)] = inner
    return out


def _nested_or_finding(p: Parsed, key: str, kind: type, what: str) -> dict[str, dict[str, Any]] | None:
    """The manager's ``key`` as node -> group -> ``kind``, or ``None`` with a GFD008 finding."""
    value = _nested(p.manager.get(key), kind)
    if value is None:
        p.add("GFD008-bad-shape", f"{M}/{key}", f"{key} must map node -> group -> {what}; repair rebuilds it")
    return value


def _read_plain_scheduler(p: Parsed) -> None:
    m = p.manager
    p.ready = _str_list(m.get("ready"))
    if p.ready is None:
        p.add("GFD008-bad-shape", M + "/ready", "ready must be a list of node names; repair rebuilds it")
    p.remaining = _nested_or_finding(p, "remaining", int, "count")
    if p.remaining is not None:
        for target, groups in p.remaining.items():
            for group, count in groups.items():
                if count < 0:
                    p.add(
                        "GFD204-negative-counter",
                        pointer("agent_states", MANAGER, "remaining", target, group),
                        f"remaining[{target!r}][{group!r}] is {count}: {target!r} waits for a negative "
                        "number of parents; checked against the thread when a graph is given",
                    )
    p.enqueued_any = _nested_or_finding(p, "enqueued_any", bool, "true/false")
    turn = m.get("current_turn", 0)
    if not isinstance(turn, int) or isinstance(turn, bool):
        p.refuse("GFD008-bad-shape", M + "/current_turn", f"current_turn must be an integer, not {turn!r}")
    elif turn < 0:
        p.add("GFD210-negative-turn", M + "/current_turn", f"current_turn is {turn}; repair sets it to 0")
        p.turn = 0
    else:
        p.turn = turn


def _read_extension(p: Parsed) -> None:
    if "graphflow_durable" not in p.manager:
        p.add(
            "GFD006-legacy-format",
            M,
            "a state saved by plain GraphFlow (no 'graphflow_durable' section); "
            "repair checks it against the thread and upgrades it to the durable format",
        )
        return
    ext = p.manager["graphflow_durable"]
    where = M + "/graphflow_durable"
    if not isinstance(ext, Mapping):
        p.refuse("GFD007-durable-format-unknown", where, "the graphflow_durable section is not an object")
        return
    fmt = ext.get("format")
    if fmt not in DURABLE_FORMATS or isinstance(fmt, bool):
        p.refuse(
            "GFD007-durable-format-unknown",
            where + "/format",
            f"graphflow_durable format {fmt!r} is not one this version reads "
            f"({', '.join(map(str, DURABLE_FORMATS))}); upgrade graphflow-durable",
        )
        return
    p.ext = ext
    try:
        p.ext_sched = SchedulerState.from_json(ext.get("scheduler", {}))
    except StateFormatError as exc:
        p.add("GFD008-bad-shape", where + "/scheduler", f"{exc}; repair rebuilds it from the thread")
        return
    _check_view(p, p.ext_sched, where)
    _check_ranges(p, ext, where)


def _check_view(p: Parsed, sched: SchedulerState, where: str) -> None:
    """The plain keys must be the view of the authoritative durable scheduler."""
    for key, value in sched.plain_view().items():
        if p.manager.get(key) != value:
            p.add(
                "GFD401-view-mismatch",
                f"{M}/{key}",
                f"{key} is {p.manager.get(key)!r} but the graphflow_durable scheduler says {value!r}; "
                "repair rewrites the plain keys from the scheduler",
            )


def _check_ranges(p: Parsed, ext: Mapping[str, Any], where: str) -> None:
    size = len(p.thread_dumps)
    for key in ("batch_start", "round_start"):
        value = ext.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= size:
            p.add(
                "GFD403-bookkeeping-invalid",
                f"{where}/{key}",
                f"{key} is {value!r}, not a thread index in 0..{size}; repair recomputes it",
            )
    status = ext.get("status")
    if status not in RUN_STATUSES:
        p.add(
            "GFD402-status-mismatch",
            f"{where}/status",
            f"status {status!r} is not one of {'/'.join(RUN_STATUSES)}; repair recomputes it",
        )
    dispatches = ext.get("dispatches", {})
    if not isinstance(dispatches, Mapping) or not all(
        isinstance(v, list) and all(isinstance(i, int) and 0 <= i <= size for i in v)
        for v in dispatches.values()
    ):
        p.add(
            "GFD403-bookkeeping-invalid",
            f"{where}/dispatches",
            f"dispatches must map node -> thread indexes in 0..{size}; repair recomputes it",
        )


def sources(dumps: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ``source`` of each message dump, for short human-readable summaries."""
    return [str(d.get("source", "?")) for d in dumps]
