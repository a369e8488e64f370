"""The timer schedule that lets an idle coordinator run a batch only when a timer is due.

No JVM: the schedule, the source's tick decision and a simulation of Spark's loop around them
(its no-data batches off): a batch runs when the source's offset moves (a tick, or new input),
takes its time after the offset, runs every timeout before that time, and its keys re-arm.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.timer_schedule import Schedule, fold_into, next_tick


@pytest.mark.parametrize(
    ("before", "changes", "batch_ms", "after"),
    [
        ({}, {1: 500}, 100, {1: 500}),  # a key armed
        ({1: 500}, {1: 900}, 100, {1: 900}),  # re-armed: the new timeout replaces the old
        ({1: 500}, {1: None}, 100, {}),  # its state removed: no timer
        ({1: 50, 2: 500}, {}, 100, {2: 500}),  # 50 ran in the batch at 100 (50 < 100)
        ({1: 100}, {}, 100, {1: 100}),  # 100 did not: Spark runs T only when T < batch time
        ({1: 50}, {}, None, {1: 50}),  # a batch with no row at all: its time is not known
        ({1: 50, 2: 70}, {2: 400}, 100, {2: 400}),
    ],
)
def test_a_batch_folds_into_the_schedule(before, changes, batch_ms, after) -> None:
    assert Schedule(before).folded(changes, batch_ms).timeouts == after


@pytest.mark.parametrize(
    ("last", "timeouts", "now", "tick"),
    [
        ({"at": 0, "known": 1}, {}, 1000, None),  # nothing armed: no batch
        ({"at": 0, "known": 1}, {1: 2000}, 1000, None),  # not yet due
        ({"at": 0, "known": 1}, {1: 2000}, 2000, None),  # due only once a batch's time is past
        ({"at": 0, "known": 1}, {1: 2000}, 2001, {"at": 2001, "known": 1}),
        ({"at": 2001, "known": 1}, {1: 2000}, 2500, None),  # the tick at 2001 ran it
        ({"at": 2001, "known": 1}, {1: 2000, 2: 2300}, 2500, {"at": 2500, "known": 1}),
        (None, {}, 1000, {"at": 1000, "known": 0}),  # a checkpoint from before schedules
        ({"at": 1000, "known": 0}, {}, 1010, {"at": 1010, "known": 0}),  # ...looks every time
    ],
)
def test_the_source_ticks_when_a_timeout_has_passed(last, timeouts, now, tick) -> None:
    assert next_tick(last, Schedule(timeouts), now) == tick


def test_the_schedule_file_round_trips_and_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "cp" / "timers.json"
    assert Schedule.load(path).timeouts == {}
    fold_into(path, {3: 1500, 4: None}, 1000)
    assert fold_into(path, {5: 2500}, 1200).timeouts == {3: 1500, 5: 2500}
    assert Schedule.load(path).timeouts == {3: 1500, 5: 2500}
    assert [p.name for p in path.parent.iterdir()] == ["timers.json"]  # no temporary left


def test_replaying_a_batch_folds_to_the_same_schedule(tmp_path: Path) -> None:
    path = tmp_path / "timers.json"
    fold_into(path, {1: 900, 2: 300}, 100)
    once = fold_into(path, {2: 700, 3: None}, 400)
    assert fold_into(path, {2: 700, 3: None}, 400) == once


# --- Spark's loop, simulated ----------------------------------------------------------------

POLL_MS = 10  # Spark asks the source again after this when there is no new data
PLAN_MS = 3  # from the offset to the batch's time
RUN_MS = 40  # a batch's run time


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[int, int], list[int], list[list[int | None]]]:
    """Initial timeouts of a few keys, times input arrives, and for each key the successive
    durations it re-arms with when it runs (None: its state is removed)."""
    keys = draw(st.integers(1, 5))
    first = {k: draw(st.integers(1, 3000)) for k in range(keys)}
    inputs = sorted(draw(st.lists(st.integers(0, 4000), max_size=6)))
    rearm = [draw(st.lists(st.one_of(st.none(), st.integers(1, 1500)), min_size=8, max_size=8))
             for _ in range(keys)]
    return first, inputs, rearm


@given(scenarios())
@settings(max_examples=300, deadline=None)
def test_every_timeout_runs_soon_after_it_is_due_and_idle_batches_are_few(scenario) -> None:
    first, inputs, rearm = scenario
    armed: dict[int, int] = dict(first)  # the truth: Spark's state store
    schedule = Schedule(dict(first))  # what the last committed batch folded (the file)
    tick: dict[str, int] = {"at": 0, "known": 1}
    uses = {k: iter(durations) for k, durations in enumerate(rearm)}
    now, read_inputs, ticked, batches = 0, 0, 0, 0
    horizon = 12_000
    while now < horizon:
        new_input = [t for t in inputs[read_inputs:] if t <= now]
        moved = next_tick(tick, schedule, now)
        if moved is None and not new_input:
            now += POLL_MS
            continue
        batches += 1
        if moved is not None:
            tick, ticked = moved, ticked + 1
        read_inputs += len(new_input)
        batch_ms = now + PLAN_MS
        due = [k for k, at in armed.items() if at < batch_ms]
        for k, at in ((k, armed[k]) for k in due):
            # A timer runs no later than one poll and one batch after it is due.
            assert batch_ms - at <= POLL_MS + RUN_MS + PLAN_MS + 1, (k, at, batch_ms)
        changes: dict[int, int | None] = {}
        for k in due:
            duration = next(uses[k], None)
            changes[k] = None if duration is None else batch_ms + duration
            if duration is None:
                del armed[k]
            else:
                armed[k] = batch_ms + duration
        schedule = schedule.folded(changes, batch_ms)
        now = batch_ms + RUN_MS
    assert not [at for at in armed.values() if at < horizon - POLL_MS - RUN_MS - PLAN_MS - 1]
    # No loop: a batch per distinct time a timer came due at most, plus one per input.
    assert ticked <= sum(1 for _ in first) + sum(len(r) for r in rearm)
    assert batches <= ticked + len(inputs)
