"""The coordinator's timers as the driver sees them, so that an idle query runs a micro-batch
when a timer is due, and only then.

Spark runs a processing-time timeout only inside a micro-batch. With its no-data batches on,
a query with timeouts runs batches back to back, input or not, to find the due ones: an idle
coordinator kept its cores busy (figures: docs/decisions/0003-timer-schedule.md). txstream
turns those batches off (``txstream.streaming.engine.session``) and tells Spark when a timer is
due instead:

- the operator emits a timer row for every state key it runs: the key's new timeout, or none
  (``txstream.streaming.engine.key_step``);
- the sink's tasks return them, and its driver-side commit folds them into this schedule, a
  file on the driver (``txstream.sinks.kafka_sink``), with the id of the batch it reflects. A
  replayed batch folds the same rows into the same result;
- the source reads the schedule whenever Spark asks for its latest offset and, once the
  earliest timeout has passed, moves a tick in its offset (``txstream.sources.kafka_source``). The
  offset moved, so Spark plans a batch, and it takes that batch's time after the offset, so
  the batch runs the timeout.

Spark runs a timeout T in the first batch whose time is past T (``T < batch_ms``).

The file is a cache of what the checkpoint holds: each key's timeout is also in its state
(Spark keeps it beside the state value). A driver that starts with no file, or one that does
not reflect the checkpoint's last committed batch (another host, a crash between the fold and
Spark's commit), rebuilds it from the state (``txstream.streaming.engine.timers``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TICK", "Schedule", "fold_into", "next_tick"]

# The source offset's entry for the tick: {"at": ms of the last tick, "known": 1 or 0}. "known"
# is 0 for a checkpoint started before schedules existed: its keys' timeouts were never
# reported, so the source ticks whenever Spark asks (the old back-to-back batches).
TICK = "_tick"


@dataclass(frozen=True)
class Schedule:
    """Each state key's processing-time timeout (ms); a key without a timer is absent.
    ``batch``: the id of the last batch folded in (None: not known)."""

    timeouts: Mapping[int, int] = field(default_factory=dict)
    batch: int | None = None

    def folded(self, changes: Mapping[int, int | None], batch_ms: int | None,
               batch: int | None = None) -> Schedule:
        """The schedule after batch ``batch``, at ``batch_ms``, that ran the keys in
        ``changes`` (each with its new timeout, or None). A timeout before ``batch_ms`` ran in
        that batch, so its key reported again; one that did not report is dropped all the
        same."""
        timeouts = {
            key: at for key, at in self.timeouts.items()
            if key not in changes and (batch_ms is None or at >= batch_ms)
        }
        timeouts.update((key, at) for key, at in changes.items() if at is not None)
        return Schedule(timeouts, batch)

    def next_due(self, not_before: int) -> int | None:
        """The earliest timeout at or after ``not_before``, or None."""
        return min((at for at in self.timeouts.values() if at >= not_before), default=None)

    def to_json(self) -> str:
        return json.dumps({"timeouts": {str(k): v for k, v in sorted(self.timeouts.items())},
                           "batch": self.batch})

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        raw = json.loads(text)
        batch = raw.get("batch")
        return cls({int(k): int(v) for k, v in raw["timeouts"].items()},
                   None if batch is None else int(batch))

    @classmethod
    def load(cls, path: Path) -> Schedule:
        """The schedule in ``path``; empty if there is none yet (no batch committed)."""
        try:
            return cls.from_json(path.read_text())
        except FileNotFoundError:
            return cls()

    def save(self, path: Path) -> None:
        """Atomically: the source reads the file while a batch commits."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".timers-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def fold_into(path: Path, changes: Mapping[int, int | None], batch_ms: int | None,
              batch: int | None = None) -> Schedule:
    """Fold one committed batch into the schedule file; returns the new schedule."""
    schedule = Schedule.load(path).folded(changes, batch_ms, batch)
    schedule.save(path)
    return schedule


def next_tick(last: Mapping[str, int] | None, schedule: Schedule | None, now: int
              ) -> dict[str, int] | None:
    """The tick of the next offset, or None to keep ``last`` (no batch is needed for timers).

    ``last``: the tick in the batch's start offset, None if the checkpoint predates ticks.
    Only timeouts at or after the last tick count: the batch that tick started ran every
    earlier one, so a stale entry costs at most one batch, never a loop.
    """
    if last is None or not last.get("known", 1):
        return {"at": now, "known": 0}  # timeouts unknown: look every time
    if schedule is None:
        return None
    due = schedule.next_due(last.get("at", 0))
    if due is None or due >= now:
        return None
    return {"at": now, "known": 1}
