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

__all__ = ["digest", "dumps", "loads", "state_text", "surrogate_problem", "too_deep"]

# One encoder for every call: json.dumps() with options builds a new JSONEncoder each time.
_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def dumps(value: Any, *, where: str = "value", node: str | None = None) -> str:
    """Encode ``value`` as canonical JSON text.

    Only when the fast encoder fails (or its text holds a lone surrogate, which UTF-8 cannot
    hold) is the value walked to find the culprit; the walk is iterative, so a value nested
    thousands of levels deep is located as well.

    Raises:
        NotSerializableError: naming the JSON Pointer (below ``where``) of the first value that
            JSON cannot hold, e.g. ``agent_state/model_context/messages/3/content: bytes``, and the
            ``node`` whose value it is, when given.
    """
    try:
        text = _encode(value)
        if not text.isascii():  # O(1) in CPython; only non-ASCII text can hold a lone surrogate
            text.encode("utf-8")
        return text
    except (TypeError, ValueError, RecursionError) as exc:
        raise _not_serialisable(value, where, node, exc) from exc


def _not_serialisable(value: Any, where: str, node: str | None, exc: BaseException) -> NotSerializableError:
    """The error naming where in ``value`` the encoder failed (``exc``)."""
    owner = f"node {node!r}: " if node is not None else ""
    bad = _find_unserialisable(value, where)
    if bad is None:
        if isinstance(exc, RecursionError):
            depth, path = _deepest(value, where)
            return NotSerializableError(
                f"{owner}cannot store {_short_pointer(path)}: the value is nested {depth} levels deep, "
                "deeper than the JSON encoder can go; store a flatter value",
                where=path,
                node=node,
            )
        return NotSerializableError(f"{owner}cannot store {where}: {exc}", where=where, node=node)
    path, culprit, problem = bad
    return NotSerializableError(
        f"{owner}cannot store {_short_pointer(path)}: {problem}",
        where=path,
        type_name=type(culprit).__name__,
        node=node,
    )


_plain_json = TypeAdapter(JsonValue, config=ConfigDict(allow_inf_nan=False))


def state_text(value: Any, *, where: str = "value", node: str | None = None) -> str:
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
        return dumps(value, where=where, node=node)


def loads(text: str | bytes) -> Any:
    """Decode JSON text written by :func:`dumps`."""
    return json.loads(text)


def too_deep(value: Any, limit: int) -> tuple[str | int, ...] | None:
    """The keys (and list indexes) leading to the first container of ``value`` nested deeper than
    ``limit`` levels, or ``None`` when none is. Iterative, so a value nested far deeper than Python's
    recursion limit is measured as well; it stops at the first such container.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, Mapping):
            children: list[tuple[Any, tuple[str | int, ...]]] = [
                (child, (*path, str(key))) for key, child in item.items()
            ]
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes, bytearray)):
            children = [(child, (*path, index)) for index, child in enumerate(item)]
        else:
            continue
        if len(path) >= limit:
            return path
        stack.extend(reversed(children))
    return None


def digest(text: str) -> str:
    """SHA-256 hex digest of canonical JSON text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_NOT_JSON = "store only what AutoGen's dump()/save_state() produce (plain JSON types)"


def _find_unserialisable(value: Any, path: str) -> tuple[str, Any, str] | None:
    """Depth-first (iterative) search for the first value json cannot encode, or UTF-8 cannot hold.

    Returns ``(pointer, value, what is wrong)``, or ``None`` when every value is fine.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    on_path: set[int] = set()  # ids of the containers above the value being looked at
    exits: list[tuple[int, int]] = []  # (stack height at which it is left, id) per container above
    while stack:
        while exits and len(stack) <= exits[-1][0]:
            on_path.discard(exits.pop()[1])
        item, where = stack.pop()
        if isinstance(item, str):
            problem = surrogate_problem(item)
            if problem is not None:
                return where, item, problem
            continue
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return where, item, f"float {item!r} is not JSON-serialisable; {_NOT_JSON}"
            continue
        if isinstance(item, Mapping) or (
            isinstance(item, Sequence) and not isinstance(item, (bytes, bytearray))
        ):
            if id(item) in on_path:
                return where, item, "the value contains itself (a circular reference)"
            children: list[tuple[Any, str]] = []
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if not isinstance(key, (str, int, float, bool)) and key is not None:
                        return (
                            f"{where}/{key!r}",
                            key,
                            f"{type(key).__name__} key {_short(key)} is not JSON-serialisable; {_NOT_JSON}",
                        )
                    if isinstance(key, str) and surrogate_problem(key) is not None:
                        return f"{where}/{_escape(key)}", key, f"key: {surrogate_problem(key)}"
                    children.append((child, f"{where}/{_escape(str(key))}"))
            else:
                children = [(child, f"{where}/{index}") for index, child in enumerate(item)]
            exits.append((len(stack), id(item)))
            on_path.add(id(item))
            stack.extend(reversed(children))
            continue
        return where, item, f"{type(item).__name__} {_short(item)} is not JSON-serialisable; {_NOT_JSON}"
    return None


def surrogate_problem(text: str) -> str | None:
    """What is wrong with ``text`` if UTF-8 cannot hold it (a lone surrogate), else ``None``."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"the string holds a lone surrogate {text[exc.start]!r} at character {exc.start}, which "
            "UTF-8 cannot encode; store text without unpaired surrogates"
        )
    return None


def _deepest(value: Any, path: str) -> tuple[int, str]:
    """The nesting depth of ``value`` and the pointer of its (first) deepest container."""
    best, best_path = 0, path
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, Mapping):
            children = [(child, f"{where}/{_escape(str(key))}") for key, child in item.items()]
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes, bytearray)):
            children = [(child, f"{where}/{index}") for index, child in enumerate(item)]
        else:
            continue
        if depth + 1 > best:
            best, best_path = depth + 1, where
        stack.extend((child, at, depth + 1) for child, at in reversed(children))
    return best, best_path


def _short_pointer(path: str) -> str:
    """A pointer short enough for a message (a deep one loses its middle), lone surrogates escaped."""
    path = path.encode("utf-8", "backslashreplace").decode("utf-8")
    return path if len(path) <= 120 else f"{path[:60]}...{path[-40:]}"


def _escape(token: str) -> str:
    """Escape one JSON Pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")
