"""The buffer rule (``_model/buffers.py``; docs/state-format.md, "Buffer rule").

A participant hears every published message but its own since its last dispatch; an in-flight
participant's input is what it heard between its previous dispatch and its last one, and what was
published since waits behind its turn (``deferred``). The property test compares the rule with a
reference that does not compute it at all: it replays the thread the way GraphFlow's containers
live it (every published message appended to every other participant's buffer, a dispatch taking
the buffer as input and emptying it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from graphflow_durable._model.buffers import Buffers, LogEntry, buffer_indexes, participant_buffers

PEOPLE = ("A", "B", "C", "D")


def entry(i: int, source: str | None, published: bool = True) -> LogEntry:
    """Message ``i`` of a thread: user input (``source`` None) or ``source``'s answer."""
    return LogEntry({"i": i, "source": source or "user"}, published, source)


def simulate(
    entries: Sequence[LogEntry], dispatch_history: Mapping[str, Sequence[int]], in_flight: set[str]
) -> dict[str, tuple[list[int], list[int]]]:
    """The reference: live the thread, message by message, as the participants' containers do."""
    buffers: dict[str, list[int]] = {p: [] for p in PEOPLE}
    inputs: dict[str, list[int]] = {}
    for length in range(len(entries) + 1):
        for p in PEOPLE:
            if length in dispatch_history.get(p, ()):  # p's turn starts: its buffer is its input
                inputs[p], buffers[p] = buffers[p], []
        if length < len(entries) and entries[length].published:
            for p in PEOPLE:
                if entries[length].completes != p:
                    buffers[p].append(length)
    out: dict[str, tuple[list[int], list[int]]] = {}
    for p in PEOPLE:
        if p in in_flight and dispatch_history.get(p):
            out[p] = (inputs[p], buffers[p])  # its turn has not ended: the rest waits behind it
        else:
            out[p] = (buffers[p], [])
    return out


@st.composite
def threads(draw: st.DrawFn) -> tuple[list[LogEntry], dict[str, list[int]], set[str]]:
    n = draw(st.integers(0, 14))
    # Every third message is published (user input and answers are); others may be inner events.
    entries = [
        entry(i, draw(st.sampled_from([None, *PEOPLE])), i % 3 == 0 or draw(st.booleans())) for i in range(n)
    ]
    history = {
        p: sorted(draw(st.sets(st.integers(0, n), max_size=4)))
        for p in sorted(draw(st.sets(st.sampled_from(PEOPLE))))
    }
    in_flight = draw(st.sets(st.sampled_from(PEOPLE)))
    return entries, history, in_flight


@given(threads())
def test_buffers_equal_the_thread_lived_message_by_message(
    case: tuple[list[LogEntry], dict[str, list[int]], set[str]],
) -> None:
    entries, history, in_flight = case
    last_two = {p: points[-2:] for p, points in history.items()}  # what the cursor keeps
    got = buffer_indexes(entries, PEOPLE, last_two, in_flight)
    expected = simulate(entries, history, in_flight)
    assert {p: (list(b), list(d)) for p, (b, d) in got.items()} == expected


@given(threads())
def test_participant_buffers_hold_the_message_bodies_of_those_indexes(
    case: tuple[list[LogEntry], dict[str, list[int]], set[str]],
) -> None:
    entries, history, in_flight = case
    indexes = buffer_indexes(entries, PEOPLE, history, in_flight)
    buffers = participant_buffers(entries, PEOPLE, history, in_flight)
    assert set(buffers) == set(PEOPLE)
    for p, (buffer, deferred) in indexes.items():
        assert buffers[p] == Buffers(
            tuple(entries[i].body for i in buffer), tuple(entries[i].body for i in deferred)
        )


# -- examples, small enough to read ---------------------------------------------------------------

# user, A, B, C answered in turn: A dispatched at 1, B at 2, C at 3.
CHAIN = [entry(0, None), entry(1, "A"), entry(2, "B"), entry(3, "C")]


def idx(
    entries: Sequence[LogEntry], dispatches: Mapping[str, Sequence[int]], in_flight: Sequence[str] = ()
) -> dict[str, Any]:
    return buffer_indexes(entries, PEOPLE, dispatches, set(in_flight))


def test_a_participant_hears_every_published_message_but_its_own_since_its_last_dispatch() -> None:
    got = idx(CHAIN, {"A": [1], "B": [2], "C": [3]})
    assert got["A"] == ((2, 3), ())  # not its own answer (index 1); nothing before its dispatch
    assert got["B"] == ((3,), ())
    assert got["C"] == ((), ())  # its own answer is all that came after
    assert got["D"] == ((0, 1, 2, 3), ())  # never dispatched: everything


def test_unpublished_messages_are_in_nobodys_buffer() -> None:
    thread = [entry(0, None), entry(1, "A", published=False), entry(2, "A")]
    assert idx(thread, {"A": [1]})["B"] == ((0, 2), ())


def test_an_in_flight_participants_input_is_what_it_heard_before_its_turn_and_the_rest_is_deferred() -> None:
    # B dispatched at 2 (after user and A), still running while C (dispatched with it) answered.
    thread = [entry(0, None), entry(1, "A"), entry(2, "C"), entry(3, "D")]
    got = idx(thread, {"A": [1], "B": [2], "C": [2]}, in_flight=["B"])
    assert got["B"] == ((0, 1), (2, 3))


def test_an_in_flight_participants_input_starts_at_its_previous_dispatch() -> None:
    # A loop: A spoke at 1, is dispatched again at 3 and is in flight.
    thread = [entry(0, None), entry(1, "A"), entry(2, "B"), entry(3, "C")]
    got = idx(thread, {"A": [1, 3]}, in_flight=["A"])
    assert got["A"] == ((2,), (3,))


def test_an_in_flight_participant_never_dispatched_has_no_deferred_messages() -> None:
    assert idx(CHAIN, {}, in_flight=["A"])["A"] == ((0, 2, 3), ())
