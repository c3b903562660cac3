"""Deltas between JSON values, for agent states that grow every turn.

An agent's saved state (a model context, say) usually changes by appending to a list. Storing it
whole after every turn writes O(history) bytes per turn; storing :func:`diff` writes only what
changed. A patch is a JSON object of one of these forms:

- ``{"=": value}`` -- replace the value;
- ``{"+": [items]}`` -- the value is a list extended by ``items``;
- ``{"set": {key: value}, "del": [key, ...], "sub": {key: patch}}`` -- the value is an object;
  each part is present only when not empty.

Pure: no I/O, nothing of AutoGen or SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["apply", "diff"]


def diff(old: Any, new: Any) -> dict[str, Any]:
    """A patch turning ``old`` into ``new`` (``{}`` when they are equal)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: dict[str, Any] = {}
        assign: dict[str, Any] = {}
        nested: dict[str, Any] = {}
        for key, value in new.items():
            if key not in old:
                assign[key] = value
            elif old[key] != value:
                if isinstance(value, (Mapping, list)) and type(old[key]) is type(value):
                    nested[key] = diff(old[key], value)
                else:
                    assign[key] = value
        removed = [key for key in old if key not in new]
        if assign:
            out["set"] = assign
        if removed:
            out["del"] = removed
        if nested:
            out["sub"] = nested
        return out
    if isinstance(old, list) and isinstance(new, list):
        if old == new:
            return {}
        if len(new) >= len(old) and new[: len(old)] == old:
            return {"+": new[len(old) :]}
    if old == new:
        return {}
    return {"=": new}


def apply(old: Any, patch: Mapping[str, Any]) -> Any:
    """The value ``patch`` (from :func:`diff`) makes of ``old``; ``old`` is not modified."""
    if "=" in patch:
        return patch["="]
    if "+" in patch:
        return [*old, *patch["+"]]
    if not patch:
        return old
    value = dict(old)
    for key in patch.get("del", ()):
        value.pop(key, None)
    value.update(patch.get("set", {}))
    for key, sub in patch.get("sub", {}).items():
        value[key] = apply(value[key], sub)
    return value
