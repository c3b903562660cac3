"""The declarative side of DurableGraphFlow: its component config and loading saved states.

Here so that the public facade (``flow``) needs none of AutoGen's private names.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
from autogen_agentchat.base import ChatAgent, TerminationCondition
from autogen_agentchat.teams import DiGraph
from autogen_agentchat.teams._group_chat._graph._digraph_group_chat import GraphFlowConfig

from graphflow_durable._storage.urls import parse_store_url
from graphflow_durable.errors import NotSerializableError, StateFormatError, UsageError
from graphflow_durable.integrity import repair_state
from graphflow_durable.ratelimit import RateLimit
from graphflow_durable.store import Store

__all__ = [
    "ALWAYS_RESUME_ENV",
    "DEFAULT_STORE_ENV",
    "DurableGraphFlowConfig",
    "GraphFlowConfig",
    "always_resume",
    "check_crash_attempts",
    "config_store_url",
    "default_store_url",
    "durable_state",
    "flow_arguments",
    "refuse_callables",
]

logger = logging.getLogger("graphflow_durable.flow")

DEFAULT_STORE_ENV = "GRAPHFLOW_DURABLE_STORE"
"""Environment variable naming the store URL used when ``store=`` is not given."""


ALWAYS_RESUME_ENV = "GRAPHFLOW_DURABLE_ALWAYS_RESUME"
"""Environment variable: ``1`` makes every run tear itself down and resume from the store after
each agent's committed answer (a test mode: ``pytest --gfd-always-resume`` sets it)."""


def always_resume() -> bool:
    """Whether ``$GRAPHFLOW_DURABLE_ALWAYS_RESUME`` asks for the always-resume test mode (read at
    each run, so that it reaches subprocesses and a test may turn it on or off)."""
    return os.environ.get(ALWAYS_RESUME_ENV, "").strip() == "1"


def default_store_url(*, make_directory: bool = True) -> str:
    """``$GRAPHFLOW_DURABLE_STORE``, else ``sqlite:///./.graphflow_durable/runs.db`` (created on use;
    ``make_directory=False``: its folder is not created either, for a caller that only reads)."""
    url = os.environ.get(DEFAULT_STORE_ENV)
    if url:
        return url
    path = Path.cwd() / ".graphflow_durable" / "runs.db"
    if make_directory:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


_opened: dict[str, Store] = {}
_opening = threading.Lock()


def shared_store(url: str) -> Store:
    """The process's open store for ``url``: teams given the same URL share one ``Store`` (one
    connection pool, one writer thread that commits their transitions together). A closed one is
    opened again."""
    with _opening:
        # Forget the closed ones: each holds its engine's caches (thousands of objects), and a
        # process that goes through many store URLs would keep every one it ever opened; their
        # sheer number made each full garbage collection of a long test run pause for seconds.
        for closed in [key for key, store in _opened.items() if store.closed]:
            del _opened[closed]
        store = _opened.get(url)
        if store is None:
            store = _opened[url] = Store(url)
        return store


class DurableGraphFlowConfig(GraphFlowConfig):
    """The declarative configuration of :class:`~graphflow_durable.DurableGraphFlow`: GraphFlow's plus
    its own settings.

    ``store`` is the store URL with its options and without its password (supply that from
    ``PGPASSWORD`` or ``~/.pgpass``); ``None`` is the default store. ``run_id`` is written only when
    it was chosen, so a reloaded team with a generated id is an independent team, as GraphFlow's.
    """

    store: str | None = None
    run_id: str | None = None
    allow_graph_change: bool = False
    lease_seconds: float = 30.0
    interrupt_grace_seconds: float = 5.0
    human_input: Any = None
    retry: Any = None
    timeout: Any = None
    max_crash_attempts: int = 5
    record_calls: bool = False
    rate_limits: list[dict[str, Any]] = pydantic.Field(default_factory=list)


def check_crash_attempts(value: Any) -> int:
    """``max_crash_attempts`` as given, checked: an int 1 or more (else a ``UsageError``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(
            f"max_crash_attempts must be an int 1 or more, not {value!r}", option="max_crash_attempts"
        )
    return value


def refuse_callables(graph: DiGraph) -> None:
    """A callable edge condition cannot be serialised: refuse loudly instead of dropping it."""
    for node in graph.nodes.values():
        for edge in node.edges:
            if edge.condition_function is not None:
                raise NotSerializableError(
                    f"edge {node.name!r} -> {edge.target!r} has a callable condition, which cannot be "
                    "serialised; use a string condition, or rebuild the team in code instead of "
                    "dump_component()/load_component()",
                    where=f"edge {node.name!r} -> {edge.target!r}",
                )


def config_store_url(store: str | Store | None, team_name: str) -> str | None:
    """The store URL to write into a config: its options kept, its password never written."""
    if store is None:
        return None
    parsed = store if isinstance(store, Store) else parse_store_url(store)
    if parsed.has_password:
        logger.warning(
            "team %s: the store URL's password is not written into the component config; "
            "the loaded team's driver reads it from PGPASSWORD or ~/.pgpass",
            team_name,
        )
    return parsed.config_url


def durable_state(
    state: Mapping[str, Any], *, graph: DiGraph, fingerprint: str, manager_name: str, run_id: str
) -> dict[str, Any]:
    """A deep copy of a saved team state in the durable format; a plain GraphFlow state is
    repaired first, with one WARNING line summing up what changed (each change at DEBUG)."""
    copied: dict[str, Any] = copy.deepcopy(dict(state))
    agent_states = copied.get("agent_states")
    manager = agent_states.get(manager_name) if isinstance(agent_states, Mapping) else None
    if not isinstance(manager, Mapping):
        raise StateFormatError(
            f"not a team state: expected 'agent_states' with a {manager_name!r} entry, "
            "as GraphFlow.save_state() writes",
            run_id=run_id,
            pointer="/agent_states",
        )
    if "graphflow_durable" in manager:
        return copied
    repaired = repair_state(copied, graph=graph, graph_fingerprint=fingerprint)
    codes = sorted({f.code for f in repaired.report.findings if f.severity != "info"})
    status = repaired.state["agent_states"][manager_name]["graphflow_durable"]["status"]
    logger.warning(
        "run %s: loaded a plain GraphFlow state (%d messages) as %s; %d field(s) repaired%s",
        run_id,
        len(manager.get("message_thread", ())),
        status,
        len(repaired.changes),
        f" ({', '.join(codes)}; see docs/repair.md)" if codes else "",
    )
    for change in repaired.changes:
        logger.debug("run %s: repaired %s", run_id, change)
    return copy.deepcopy(dict(repaired.state))


def flow_arguments(config: GraphFlowConfig) -> tuple[list[ChatAgent], DiGraph, dict[str, Any]]:
    """DurableGraphFlow's constructor arguments from its component config (a plain GraphFlow's too):
    the participants, the graph and the keyword arguments."""
    participants = [ChatAgent.load_component(p) for p in config.participants]
    termination = (
        TerminationCondition.load_component(config.termination_condition)
        if config.termination_condition
        else None
    )
    durable = config if isinstance(config, DurableGraphFlowConfig) else DurableGraphFlowConfig(**dict(config))
    return (
        participants,
        config.graph,
        {
            "name": config.name,
            "description": config.description,
            "termination_condition": termination,
            "max_turns": config.max_turns,
            "store": durable.store,
            "run_id": durable.run_id,
            "allow_graph_change": durable.allow_graph_change,
            "lease_seconds": durable.lease_seconds,
            "interrupt_grace_seconds": durable.interrupt_grace_seconds,
            "human_input": durable.human_input,
            "retry": durable.retry,
            "timeout": durable.timeout,
            "max_crash_attempts": durable.max_crash_attempts,
            "record_calls": durable.record_calls,
            "rate_limits": [RateLimit(**x) for x in durable.rate_limits] or None,
        },
    )
