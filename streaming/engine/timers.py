"""Where the driver keeps the timer schedule, and how a starting driver rebuilds it.

The sink's commit and the source's planner run in two Python processes of their own on the
driver, with no way into the JVM; the schedule passes between them as a file in the driver's
temporary directory (:func:`schedule_file`). It is a cache: every key's timeout is also kept
by Spark beside the key's state, in the checkpoint. A driver that starts without the file, or
with one that does not reflect the checkpoint's last committed batch (a restart on another
host, a crash between the sink's fold and Spark's commit), reads the timeouts back from the
state (:func:`restore_schedule`), so its due back-checks go out without new input
(docs/decisions/0003-timer-schedule.md).
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path
from typing import Any

from txstream.streaming.engine.checkpoint import Checkpoint
from txstream.timer_schedule import Schedule

__all__ = ["schedule_file", "restore_schedule"]

log = logging.getLogger(__name__)


def schedule_file(location: str) -> Path:
    """The schedule file of the checkpoint at ``location`` on this driver."""
    digest = hashlib.sha256(location.encode("utf-8")).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / "txstream-timers" / f"{digest}.json"


def _from_state(spark: Any, location: str, batch: int) -> Schedule:
    # The state reader registers with the StateStoreCoordinator, which a session creates with
    # its streaming query manager: touch it first (a fresh session has none).
    _ = spark.streams.active
    rows = (spark.read.format("statestore").option("batchId", str(batch)).load(location)
            .select("key.state_key", "value.timeoutTimestamp").collect())
    return Schedule({int(key): int(at) for key, at in rows if at is not None and at > 0}, batch)


def restore_schedule(spark: Any, checkpoint: Checkpoint) -> Path:
    """The schedule file for ``checkpoint``, made to reflect its last committed batch;
    returns its path."""
    path = schedule_file(checkpoint.location)
    batch = checkpoint.last_committed_batch()
    if batch is None:  # a new checkpoint: no key has a timer yet
        path.unlink(missing_ok=True)
        return path
    try:
        if Schedule.load(path).batch == batch:
            return path
    except (ValueError, KeyError, TypeError):
        pass  # a damaged cache: rebuilt below
    schedule = _from_state(spark, checkpoint.location, batch)
    schedule.save(path)
    log.info("timer schedule of %s rebuilt from the state of batch %d: %d keys with a timer",
             checkpoint.location, batch, len(schedule.timeouts))
    return path
