"""The source's progress time and its recovery from the history topic, rule by rule (pure)."""

from __future__ import annotations

from typing import Any, NamedTuple

from txstream.outputs import encode_history
from txstream.schema import EventKind
from txstream.sources.journal import JOURNAL, OUTCOME_OF, Journal, outcome_rows
from txstream.sources.offsets import canonical
from txstream.sources.progress import ProgressClock
from txstream.state.keys import KeyLayout, state_key
from txstream.topics import Topics

E0, E1 = ("end", 0), ("end", 1)


def test_an_end_offset_is_vouched_for_as_of_the_planning_before() -> None:
    clock = ProgressClock()
    clock.observed(1000, {E0: 5, E1: 3})  # the first planning: a new consumer, its own time
    assert clock.progress({E0: 5, E1: 3}, 0) == 1000
    clock.observed(2000, {E0: 9, E1: 3})  # may be a fetch answered during the one at 1000
    assert clock.progress({E0: 9, E1: 3}, 0) == 1000
    clock.observed(3000, {E0: 9, E1: 4})
    assert clock.progress({E0: 9, E1: 4}, 0) == 2000


def test_a_batch_proves_only_what_it_reads_on_every_end_partition() -> None:
    clock = ProgressClock()
    clock.observed(1000, {E0: 5, E1: 3})
    clock.observed(2000, {E0: 8, E1: 6})
    clock.observed(3000, {E0: 8, E1: 6})
    assert clock.progress({E0: 5, E1: 2}, 0) == 0  # E1 behind the first observation
    assert clock.progress({E0: 7, E1: 6}, 0) == 1000  # a backlog read part of the way
    assert clock.progress({E0: 8, E1: 6}, 0) == 2000
    assert clock.progress({E0: 5, E1: 3}, 1500) == 1500  # never back


def test_what_a_planned_batch_proves_is_kept_no_longer() -> None:
    clock = ProgressClock()
    clock.observed(1000, {E0: 5})
    clock.observed(2000, {E0: 9})
    clock.planned(clock.progress({E0: 5}, 0))
    assert clock.progress({E0: 9}, 1000) == 1000  # the next observation: vouched at 1000
    clock.observed(3000, {E0: 9})
    assert clock.progress({E0: 9}, 1000) == 2000


def test_a_recovery_reads_the_history_topic_to_where_it_ended_then_is_done() -> None:
    assert Journal.starting({0: 0, 1: 0}, {0: 5}) is None  # nothing decided: nothing to read
    journal = Journal.starting({0: 10, 1: 3, 2: 0}, {0: 40, 1: 0})
    assert journal is not None and journal.to == {0: 10, 1: 3} and not journal.done
    # Where the half topic ended: its records below were maybe read before (0029).
    assert journal.again == {0: 40, 1: 0}
    step = journal.step(4)
    assert step.at == {0: 2, 1: 2} and list(step.ranges(journal)) == [(0, 0, 2), (1, 0, 2)]
    step = step.step(4).step(4)
    assert step.at == {0: 8, 1: 3}
    step = step.step(None)
    assert step.done and step.at == {0: 10, 1: 3} and step.again == journal.again
    assert Journal.of(step.entry()).__dict__ == step.__dict__  # as the offset keeps it
    kept = canonical({}, [], journal=step.entry())[JOURNAL]
    assert Journal.of(kept).__dict__ == step.__dict__
    # An offset written before the half topic's ends were kept reads as none read again.
    assert Journal.of({"at": {"0": 1}, "to": {"0": 1}}).again == {}


class _Rec(NamedTuple):
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int


def test_the_outcomes_of_the_history_become_rows_for_their_transactions() -> None:
    layout, topics = KeyLayout(), Topics()
    lines = [("tx-a", 1, "half", {}), ("tx-a", 2, "released", {}),
             ("tx-b", 3, "rolled_back", {}), ("tx-c", 4, "discarded", {}),
             ("tx-d", 5, "release_lost", {}), ("tx-e", 6, "expired", {})]
    [(record, _)] = encode_history(lines, b"7", topics)
    records: list[Any] = [_Rec(record.key, record.value, 0, 11),
                          _Rec(b"x", b"not history", 0, 12)]
    rows = list(outcome_rows(records, layout))
    assert [(bytes(r.key).decode(), bytes(r.value).decode()) for r in rows] == [
        ("tx-a", "COMMITTED"), ("tx-b", "ROLLED_BACK"), ("tx-c", "DISCARDED"),
        ("tx-d", "LOST")]
    assert {r.kind for r in rows} == {EventKind.OUTCOME}
    assert [r.state_key for r in rows] == [state_key(t, layout) for t in "abcd" for t in
                                           [f"tx-{t}"]]
    assert set(OUTCOME_OF.values()) == {"COMMITTED", "ROLLED_BACK", "DISCARDED", "LOST"}


def test_a_transaction_registered_without_an_outcome_is_handed_in_doubt() -> None:
    """A half note with no outcome in the records read: an earlier life may have released it
    unnoted (decision 0029); one whose outcome the same records tell is not in doubt."""
    layout, topics = KeyLayout(), Topics()
    lines = [("tx-a", 1, "half", {}), ("tx-b", 2, "half", {}), ("tx-b", 3, "check_sent", {}),
             ("tx-a", 4, "released", {}), ("tx-c", 5, "half", {})]
    [(record, _)] = encode_history(lines, b"7", topics)
    rows = list(outcome_rows([_Rec(record.key, record.value, 0, 11)], layout))
    assert [(bytes(r.key).decode(), bytes(r.value).decode()) for r in rows] == [
        ("tx-a", "COMMITTED"), ("tx-b", "IN_DOUBT"), ("tx-c", "IN_DOUBT")]
