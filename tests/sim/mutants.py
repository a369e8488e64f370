"""The oracle's own test: each recovery guard taken out in turn, and the seeds that then fail.

A guard the simulation cannot see fail is a guard nothing checks. ``TXSTREAM_SIM_MUTANT=NAME
pytest -m sim tests/sim/test_sim.py`` plays the schedules with guard ``NAME`` removed and reports
how many broke the promise (the test passes when at least one did); ``NAME=all`` plays each in
turn and prints the table. ``tests/sim/test_sim_defects.py`` pins one failing seed per guard, so
CI keeps every guard covered without playing each over 1,000 schedules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import txstream.readback.release_index as release_index
import txstream.sinks.kafka_sink as kafka_sink
import txstream.sources.journal as journal
import txstream.sources.topic_watch as topic_watch
import txstream.streaming.engine.key_step as key_step

__all__ = ["GUARDS", "removed"]


def _journal(mp: pytest.MonkeyPatch) -> None:
    """0023: a new checkpoint reads the topics again knowing nothing decided before it."""
    mp.setattr(journal.Journal, "starting", classmethod(lambda cls, ends, half_ends: None))


def _look(mp: pytest.MonkeyPatch) -> None:
    """0029: a new checkpoint takes the history for every release its predecessor made."""
    mp.setattr(key_step, "_found_released", lambda *args: [])


def _replay_check(mp: pytest.MonkeyPatch) -> None:
    """0005: a replayed batch writes again what its crashed run wrote."""
    mp.setattr(kafka_sink, "_not_yet_written", lambda options, rows: rows)


def _record_ids(mp: pytest.MonkeyPatch) -> None:
    """0005: record ids that a replay does not give again (numbered per process, not from the
    state), so the replay check finds nothing of the crashed run."""
    numbers = itertools.count(1 << 40)
    mp.setattr(key_step, "record_id",
               lambda tag, key, epoch, number: f"{tag}.{key}.{epoch}.{next(numbers)}")


def _topic_ids(mp: pytest.MonkeyPatch) -> None:
    """KIP-516: a half topic deleted and created again is seen only by its offsets."""
    mp.setattr(topic_watch, "topic_ids", lambda consumer, topics: {})


def _held_look(mp: pytest.MonkeyPatch) -> None:
    """0029 under a held high watermark: a new checkpoint's look takes a real-topic partition
    whose leader is short of in-sync replicas, its high watermark held below a predecessor's
    release, for one that holds no release."""
    for name in ("unless_held", "unless_held_before_ends"):
        mp.setattr(release_index, name, lambda settings, topic, looked_for: None)


GUARDS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "journal": _journal,
    "look": _look,
    "replay-check": _replay_check,
    "record-ids": _record_ids,
    "topic-ids": _topic_ids,
    "held-look": _held_look,
}


@contextmanager
def removed(name: str | None) -> Iterator[Any]:
    """The code with guard ``name`` taken out (None: as it is)."""
    with pytest.MonkeyPatch.context() as mp:
        if name is not None:
            GUARDS[name](mp)
        yield mp
