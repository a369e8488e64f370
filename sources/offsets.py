"""The ``txstream-events`` stream offset: its JSON shape, and how a read budget is spread.

``{topic: {str(partition): next offset}}`` for the half and end topics, plus entries that are
no topic: the timer tick (:data:`txstream.timer_schedule.TICK`), the progress time
(:data:`txstream.sources.progress.ENDS_READ`), a recovery from the history topic
(:data:`txstream.sources.journal.JOURNAL`) and the topics' ids
(:data:`txstream.sources.data_loss.TOPIC_IDS`). Spark stores it in the checkpoint and
compares offsets as JSON text: one key order, always, or "no new data" would look new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from txstream.sources.data_loss import TOPIC_IDS
from txstream.sources.journal import JOURNAL
from txstream.sources.progress import ENDS_READ
from txstream.timer_schedule import TICK

__all__ = ["Offsets", "RESERVED", "canonical", "records_of", "spread_budget"]

# {topic: {str(partition): next offset to read}}, and the entries below.
Offsets = dict[str, Any]
RESERVED = frozenset({TICK, ENDS_READ, JOURNAL, TOPIC_IDS})


def spread_budget(available: Sequence[int], budget: int) -> list[int]:
    """Split ``budget`` rows over partitions with ``available`` rows each, max-min fairly.

    Every partition gets an equal share, a partition needing less gives the rest back to the
    others; rows left over after the even split go to the partitions furthest behind, so a
    budget smaller than the number of partitions still reaches every partition in turn.
    """
    take = [0] * len(available)
    left = max(0, budget)
    active = [i for i, a in enumerate(available) if a > 0]
    while left > 0 and active:
        share = left // len(active)
        if share == 0:
            behind = sorted(active, key=lambda i: (take[i] - available[i], i))
            for i in behind[:left]:
                take[i] += 1
            break
        for i in active:
            add = min(share, available[i] - take[i])
            take[i] += add
            left -= add
        active = [i for i in active if take[i] < available[i]]
    return take


def canonical(offsets: Mapping[str, Any], topics: Sequence[str],
              tick: Mapping[str, int] | None = None, ends_read: int | None = None,
              journal: Mapping[str, Any] | None = None,
              ids: Mapping[str, str] | None = None) -> Offsets:
    """The offset with ``topics`` in this order, partitions by number, then the entries."""
    out: Offsets = {}
    for topic in topics:
        parts = offsets.get(topic, {})
        out[topic] = {p: int(parts[p]) for p in sorted(parts, key=int)}
    if tick is not None:
        out[TICK] = {"at": int(tick["at"]), "known": int(tick["known"])}
    if ends_read is not None:
        out[ENDS_READ] = {"at": int(ends_read)}
    if journal:
        out[JOURNAL] = {part: {p: int(o) for p, o in sorted(journal[part].items(), key=lambda
                                                             kv: int(kv[0]))}
                        for part in ("at", "to", "half") if part in journal}
    if ids:
        out[TOPIC_IDS] = {topic: str(ids[topic]) for topic in sorted(ids)}
    return out


def records_of(offsets: Mapping[str, Any]) -> dict[str, Mapping[str, int]]:
    """The topic-partition offsets alone."""
    return {topic: parts for topic, parts in offsets.items() if topic not in RESERVED}
