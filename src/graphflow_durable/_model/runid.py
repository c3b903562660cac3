"""What a run id may be: the one rule, shared by the flow and the work queue."""

from __future__ import annotations

from graphflow_durable.errors import UsageError

__all__ = ["MAX_RUN_ID_LENGTH", "RUN_ID_RULE", "check_run_id"]

#: At most this many characters (at most 2,000 bytes of UTF-8: well inside an index entry).
MAX_RUN_ID_LENGTH = 500

RUN_ID_RULE = (
    f"a run id is 1 to {MAX_RUN_ID_LENGTH} printable characters (letters, digits, punctuation, "
    "'/', inner spaces; no control characters or line breaks) without leading or trailing white space"
)


def check_run_id(run_id: object, *, option: str = "run_id") -> str:
    """``run_id`` if it is a valid run id; else a :class:`UsageError` saying what is allowed.

    Refused: a non-string, the empty string, leading or trailing white space, a character that is
    not printable (``str.isprintable``: control characters, line breaks, lone surrogates), more
    than :data:`MAX_RUN_ID_LENGTH` characters.
    """
    if not isinstance(run_id, str):
        raise UsageError(
            f"{option} must be a string, not {type(run_id).__name__}; {RUN_ID_RULE}", option=option
        )
    problem = None
    if not run_id.strip():
        problem = "is empty" if not run_id else "is only white space"
    elif run_id != run_id.strip():
        problem = "has leading or trailing white space"
    elif len(run_id) > MAX_RUN_ID_LENGTH:
        problem = f"has {len(run_id)} characters"
    elif not run_id.isprintable():
        bad = next(c for c in run_id if not c.isprintable())
        problem = f"holds the non-printable character {bad!r}"
    if problem is not None:
        shown = run_id if len(run_id) <= 60 else run_id[:57] + "..."
        shown = shown.encode("utf-8", "backslashreplace").decode("utf-8")
        raise UsageError(f"{option} {shown!r} {problem}; {RUN_ID_RULE}", run_id=run_id, option=option)
    return run_id
