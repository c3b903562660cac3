"""Canonical JSON in and out: the only place where stored bytes are made.

Canonical means sorted keys, no insignificant white space, UTF-8, and no NaN or infinity,
so the same value always gives the same text and the same digest.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic_core
from pydantic import ConfigDict, JsonValue, TypeAdapter, ValidationError

from graphflow_durable.errors import NotSerializableError

__all__ = ["digest", "dumps", "loads", "state_text"]

# One encoder for every call: json.dumps() with options builds a new JSONEncoder each time.
_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def dumps(value: Any, *, where: str = "value") -> str:
    """Encode ``value`` as canonical JSON text.

    Raises:
        NotSerializableError: naming the JSON Pointer (below ``where``) of the first value that
            JSON cannot hold, e.g. ``agent_state/model_context/messages/3/content: bytes``.
    """
    try:
        return _encode(value)
    except (TypeError, ValueError) as exc:
        path, bad = _find_unserialisable(value, where)
        raise NotSerializableError(
            f"cannot store {path}: {type(bad).__name__} {_short(bad)} is not JSON-serialisable; "
            "store only what AutoGen's dump()/save_state() produce (plain JSON types)",
            where=path,
            type_name=type(bad).__name__,
        ) from exc


_plain_json = TypeAdapter(JsonValue, config=ConfigDict(allow_inf_nan=False))


def state_text(value: Any, *, where: str = "value") -> str:
    """JSON text of an agent state, made to be compared with the same agent's previous one.

    Not canonical: keys keep the value's own order, which ``save_state()`` keeps from turn to turn.
    For plain JSON values (checked strictly first: str keys, lists, finite numbers) it is
    pydantic-core's encoder, several times faster than :func:`dumps` on large states; anything
    else (tuples, non-string keys, or what is not JSON at all) goes through :func:`dumps`, which
    raises :class:`NotSerializableError` on what JSON cannot hold.
    """
    try:
        _plain_json.validate_python(value, strict=True)
        return pydantic_core.to_json(value).decode()
    except (ValidationError, pydantic_core.PydanticSerializationError):
        return dumps(value, where=where)


def loads(text: str | bytes) -> Any:
    """Decode JSON text written by :func:`dumps`."""
    return json.loads(text)


def digest(text: str) -> str:
    """SHA-256 hex digest of canonical JSON text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _find_unserialisable(value: Any, path: str) -> tuple[str, Any]:
    """Depth-first search for the first value json cannot encode; returns (pointer, value)."""
    if value is None or isinstance(value, (str, bool, int)):
        return path, None
    if isinstance(value, float):
        return (path, value) if not math.isfinite(value) else (path, None)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                return f"{path}/{key!r}", key
            found = _find_unserialisable(item, f"{path}/{_escape(str(key))}")
            if found[1] is not None:
                return found
        return path, None
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        for index, item in enumerate(value):
            found = _find_unserialisable(item, f"{path}/{index}")
            if found[1] is not None:
                return found
        return path, None
    return path, value


def _escape(token: str) -> str:
    """Escape one JSON Pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")
