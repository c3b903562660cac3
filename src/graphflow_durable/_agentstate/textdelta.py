"""Text splices with message references, for agent states that grow every turn.

The writer encodes an agent's state as canonical JSON text after every turn. For an agent whose
state is a growing model context, what changed is one region of that text: the new messages,
inserted before the closing brackets. A *splice* stores only that region::

    {"at": p, "cut": n, "put": [piece, ...]}   turns text T into T[:p] + pieces + T[p + n:]

A piece is literal text, or the sequence number of a message of the run's log, standing for the
canonical JSON encoding of that message's ``content`` string (quotes included). An agent that
keeps what it heard and what it said would otherwise store each message a second time.

Lossless by construction: a reference replaces only an exact occurrence of the text it stands
for, whatever JSON boundaries that occurrence crosses.

Pure: no I/O, nothing of AutoGen or SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["MIN_REFERENCE", "Rope", "common_ends", "is_splice", "splice", "with_references"]

#: Contents shorter than this are stored literally: a reference would save too little.
MIN_REFERENCE = 256

Piece = str | int


def is_splice(patch: Any) -> bool:
    """Whether a stored delta body is a splice (the other kind is a ``_jsondelta`` patch)."""
    return isinstance(patch, Mapping) and "put" in patch


def splice(at: int, cut: int, pieces: Sequence[Piece]) -> dict[str, Any]:
    """The JSON body of a splice."""
    return {"at": at, "cut": cut, "put": list(pieces)}


def common_ends(old: str, new: str) -> tuple[int, int]:
    """``(p, s)``: the longest common prefix of ``old`` and ``new``, then the longest common suffix
    of what is left of both after that prefix (so ``p + s <= min(len(old), len(new))``)."""
    limit = min(len(old), len(new))
    p = _common_prefix(old, new, limit)
    return p, _common_suffix(old, new, limit - p)


def _common_prefix(a: str, b: str, limit: int) -> int:
    return _agreeing(lambda lo, hi: a[lo:hi] == b[lo:hi], limit)


def _common_suffix(a: str, b: str, limit: int) -> int:
    na, nb = len(a), len(b)
    return _agreeing(lambda lo, hi: a[na - hi : na - lo] == b[nb - hi : nb - lo], limit)


def _agreeing(same: Callable[[int, int], bool], limit: int) -> int:
    """The largest ``n <= limit`` with ``same(0, n)``, where ``same(lo, hi)`` compares the two texts'
    characters ``lo`` to ``hi`` (counted from their start, or from their end).

    Compared block by block (slices compare in C), then bisected inside the first block that
    differs; blocks double, so a long agreeing run takes few comparisons.
    """
    lo, block = 0, 4096
    while lo < limit:
        hi = min(lo + block, limit)
        if not same(lo, hi):
            while hi - lo > 1:  # the first lo characters agree; the first hi do not
                mid = (lo + hi) // 2
                if same(lo, mid):
                    lo = mid
                else:
                    hi = mid
            return lo
        lo, block = hi, block * 2
    return limit


def with_references(text: str, candidates: Sequence[tuple[int, str]]) -> list[Piece]:
    """``text`` as pieces: each candidate ``(seq, encoding)`` found is replaced by ``seq``.

    Candidates are searched in order, each after the previous one found, so the search costs one
    pass over ``text`` when they occur in order (as messages do in a context).
    """
    pieces: list[Piece] = []
    pos = 0
    for seq, encoding in candidates:
        if len(encoding) < MIN_REFERENCE:
            continue
        found = text.find(encoding, pos)
        if found < 0:
            continue
        if found > pos:
            pieces.append(text[pos:found])
        pieces.append(seq)
        pos = found + len(encoding)
    if pos < len(text) or not pieces:
        pieces.append(text[pos:])
    return pieces


class Rope:
    """A text held as pieces, each literal or a message reference, edited by splices.

    Splices near the end (where a growing context changes) cost time in the number of pieces
    after the splice point, not in the length of the text.
    """

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._refs: list[int | None] = []
        self._length = 0

    @classmethod
    def of(cls, pieces: Sequence[Piece], resolve: Callable[[int], str]) -> Rope:
        """A rope of ``pieces``, with ``resolve(seq)`` giving the text a reference stands for."""
        rope = cls()
        rope.splice(0, 0, pieces, resolve)
        return rope

    def __len__(self) -> int:
        return self._length

    def text(self) -> str:
        return "".join(self._texts)

    def pieces(self) -> list[Piece]:
        """The pieces, adjacent literals merged (what a whole snapshot stores)."""
        out: list[Piece] = []
        for text, ref in zip(self._texts, self._refs, strict=True):
            if ref is not None:
                out.append(ref)
            elif out and isinstance(out[-1], str):
                out[-1] += text
            elif text:
                out.append(text)
        return out

    def splice(self, at: int, cut: int, pieces: Sequence[Piece], resolve: Callable[[int], str]) -> None:
        """Replace ``cut`` characters at ``at`` by ``pieces``.

        Raises:
            ValueError: the range is not inside the text.
        """
        if at < 0 or cut < 0 or at + cut > self._length:
            raise ValueError(f"splice at {at} cutting {cut} is outside a text of {self._length} characters")
        i, off_i = self._locate(at)
        j, off_j = self._locate(at + cut)
        texts: list[str] = []
        refs: list[int | None] = []
        if off_i:
            texts.append(self._texts[i][:off_i])
            refs.append(None)
        for piece in pieces:
            if isinstance(piece, str):
                texts.append(piece)
                refs.append(None)
            else:
                texts.append(resolve(piece))
                refs.append(piece)
        end = j
        if off_j:
            texts.append(self._texts[j][off_j:])
            refs.append(None)
            end = j + 1
        removed = sum(map(len, self._texts[i:end]))
        self._texts[i:end] = texts
        self._refs[i:end] = refs
        self._length += sum(map(len, texts)) - removed

    def _locate(self, pos: int) -> tuple[int, int]:
        """``(i, off)``: piece ``i`` holds position ``pos`` at offset ``off`` (scanning from the end)."""
        start = self._length
        i = len(self._texts)
        while i > 0 and start > pos:
            i -= 1
            start -= len(self._texts[i])
        return i, pos - start
