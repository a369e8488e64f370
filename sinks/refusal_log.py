"""Releases the broker refused, by committed batch: from the sink's commit to the metrics.

The operator counts a release when it decides one (its keys' tallies are observed before the
sink writes), and only the sink learns that the broker refused it (its topic missing, too
large, not allowed). The sink's commit runs in a Python process of its own on the driver, the
metrics in the coordinator's: the refusals pass as a file beside the timer schedule, one JSON
line per batch that had any (:func:`record`), which the coordinator's progress listener reads
as each batch completes (:class:`RefusalReader`) and counts as refusals, not releases.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from txstream.sinks.delivery import RefusedRelease

__all__ = ["refusal_log", "record", "RefusalReader"]


def refusal_log(timer_file: str | os.PathLike[str]) -> Path:
    """The refusal log beside the timer schedule ``timer_file``."""
    return Path(f"{os.fspath(timer_file)}.refused")


def record(path: Path, batch: int, refused: Sequence[RefusedRelease]) -> None:
    """Append batch ``batch``'s refused releases (its sink's commit; a batch committed twice,
    its first commit not recorded by Spark, is written twice and counted once)."""
    if not refused:
        return
    line = json.dumps({"batch": batch, "refused": [list(r) for r in refused]})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")


class RefusalReader:
    """The lines appended to a refusal log since this reader was made (the metrics count from
    the coordinator's start), each batch once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._position = path.stat().st_size if path.exists() else 0
        self._batches: set[int] = set()

    def new(self) -> list[RefusedRelease]:
        """The refused releases of the batches committed since the last call."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(self._position)
            data = log.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        self._position += len(complete)
        out: list[RefusedRelease] = []
        for line in complete.splitlines():
            try:
                entry = json.loads(line)
                batch, refused = int(entry["batch"]), entry["refused"]
            except (ValueError, KeyError, TypeError):
                continue  # not a line of ours
            if batch not in self._batches:
                self._batches.add(batch)
                out.extend(RefusedRelease(*map(str, r)) for r in refused)
        return out
