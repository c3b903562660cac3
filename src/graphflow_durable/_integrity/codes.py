"""The finding codes of the integrity checks, and the :class:`Finding` value.

Codes are stable: ``GFD`` + three digits + a short name. The hundreds say the area: 0xx the
file's shape and versions, 1xx participants, 2xx the scheduler, 3xx loop bookkeeping, 4xx the
graphflow-durable section. Every code is documented in docs/repair.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CODES", "Finding", "Severity", "finding", "pointer"]

Severity = Literal["error", "warning", "info"]

CODES: dict[str, tuple[Severity, str]] = {
    "GFD001-not-a-team-state": ("error", "not a team state (no 'agent_states' object)"),
    "GFD002-version-missing": ("warning", "the team state has no type/version"),
    "GFD003-version-unknown": ("error", "unknown TeamState type or version"),
    "GFD004-manager-missing": ("error", "no 'GraphManager' entry in agent_states"),
    "GFD005-not-a-graphflow-state": ("error", "the manager state belongs to another kind of team"),
    "GFD006-legacy-format": ("info", "saved by plain GraphFlow; repair upgrades it"),
    "GFD007-durable-format-unknown": ("error", "unknown graphflow_durable format"),
    "GFD008-bad-shape": ("error", "a field has the wrong JSON shape"),
    "GFD009-bad-message": ("error", "a thread entry is not a message AutoGen can read"),
    "GFD010-different-graph": ("error", "the state belongs to a different graph"),
    "GFD101-participant-missing": ("error", "a graph node has no saved participant state"),
    "GFD102-extra-participant": ("info", "a participant that is not a graph node"),
    "GFD103-buffer-mismatch": ("warning", "a participant's buffer disagrees with the thread"),
    "GFD201-zombie-ready-empty": ("error", "empty ready queue with work remaining (autogen #7043)"),
    "GFD202-lost-in-flight": ("error", "nodes dispatched but never answered are not in ready"),
    "GFD203-ready-mismatch": ("error", "ready / in flight disagree with the thread"),
    "GFD204-negative-counter": ("warning", "a remaining count below zero"),
    "GFD205-impossible-counter": ("error", "a remaining count above the number of edges"),
    "GFD206-remaining-mismatch": ("error", "remaining disagrees with the thread"),
    "GFD207-enqueued-mismatch": ("error", "enqueued_any disagrees with the thread"),
    "GFD208-unknown-node": ("error", "a node or activation group the graph does not have"),
    "GFD209-thread-unexplained": ("error", "the graph cannot explain the message thread"),
    "GFD210-negative-turn": ("error", "current_turn below zero"),
    "GFD211-finished-restarts": ("info", "a finished run whose ready queue restarts the graph"),
    "GFD301-loop-cannot-rearm": ("error", "a queued loop node whose re-arm bookkeeping is lost"),
    "GFD302-triggered-mismatch": ("error", "triggered activation groups disagree with the thread"),
    "GFD401-view-mismatch": ("warning", "plain keys disagree with the graphflow_durable scheduler"),
    "GFD402-status-mismatch": ("warning", "the run status disagrees with the thread"),
    "GFD403-bookkeeping-invalid": ("warning", "dispatch/batch/round bookkeeping out of range or wrong"),
}
"""Every finding code: its severity and a one-line summary."""

NEEDS_GRAPH: tuple[str, ...] = (
    "GFD010-different-graph",
    "GFD101-participant-missing",
    "GFD102-extra-participant",
    "GFD103-buffer-mismatch",
    "GFD202-lost-in-flight",
    "GFD203-ready-mismatch",
    "GFD205-impossible-counter",
    "GFD206-remaining-mismatch",
    "GFD207-enqueued-mismatch",
    "GFD208-unknown-node",
    "GFD209-thread-unexplained",
    "GFD211-finished-restarts",
    "GFD301-loop-cannot-rearm",
    "GFD302-triggered-mismatch",
)
"""The checks that need the graph; without one they are reported as skipped."""


@dataclass(frozen=True)
class Finding:
    """One problem (or notable fact) found in a saved state.

    Attributes:
        code: stable identifier, e.g. ``"GFD201-zombie-ready-empty"`` (see docs/repair.md).
        severity: ``"error"`` (resuming it as is goes wrong), ``"warning"`` (inconsistent, repair
            fixes it) or ``"info"`` (worth knowing, nothing wrong).
        pointer: JSON Pointer (RFC 6901) to the offending place in the state, ``""`` for the whole.
        message: what is wrong and what repair does about it, in plain language.
    """

    code: str
    severity: Severity
    pointer: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "pointer": self.pointer,
            "message": self.message,
        }


def finding(code: str, where: str, message: str) -> Finding:
    """A finding with the severity registered for ``code``."""
    return Finding(code, CODES[code][0], where, message)


def pointer(*tokens: object) -> str:
    """A JSON Pointer from reference tokens, escaped as RFC 6901 says (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)
