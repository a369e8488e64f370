"""Records the checkpoint has read that the broker no longer has: which partitions start over.

Two ways a half or end partition loses them:

- it ends below the checkpoint's offset (a broker with memory storage restarted, an unclean
  leader election). A high watermark can also go back for a moment with nothing lost: a
  partition's new leader learns the high watermark from its followers' fetches, so it may
  answer with an older one just after an election. Such a partition is one the reader must see
  below for a while before it counts (``Loss.below``);
- its topic was deleted and created again. Its offsets start over at 0 and may pass the
  checkpoint's before the coordinator looks, so the offsets alone cannot tell; the topic's id
  (KIP-516) can. The ids travel in the stream offset (``"_topic_ids": {topic: id}``).

Either way the partitions are read again from offset 0 (``fail_on_data_loss=false``, after a
recovery from the history topic) or the query fails. Pure: the reader gives what it learned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["TOPIC_IDS", "Loss", "find_loss"]

# The stream offset's entry for the topics' ids.
TOPIC_IDS = "_topic_ids"


@dataclass(frozen=True)
class Loss:
    """The partitions to read again from offset 0, and why, one line per cause; ``below``:
    those that only end below the checkpoint, by their line."""

    partitions: frozenset[tuple[str, str]] = frozenset()
    why: tuple[str, ...] = ()
    below: Mapping[tuple[str, str], str] = field(default_factory=dict)

    def without(self, partitions: frozenset[tuple[str, str]]) -> Loss:
        """The loss less ``partitions`` of ``below`` (not confirmed yet)."""
        if not partitions:
            return self
        dropped = {self.below[p] for p in partitions}
        return Loss(self.partitions - partitions,
                    tuple(w for w in self.why if w not in dropped),
                    {p: w for p, w in self.below.items() if p not in partitions})


def find_loss(start: Mapping[str, Mapping[str, int]], ends: Mapping[str, Mapping[str, int]],
              known_ids: Mapping[str, str], ids: Mapping[str, str]) -> Loss:
    """``start``: the checkpoint's offsets ({topic: {partition: next offset}}); ``ends``: the
    partitions' end offsets now; ``known_ids``: the topics' ids when the checkpoint read them;
    ``ids``: their ids now (a topic missing from either is not judged by id)."""
    lost: set[tuple[str, str]] = set()
    why: list[str] = []
    below: dict[tuple[str, str], str] = {}
    for topic, now in sorted(ids.items()):
        before = known_ids.get(topic)
        parts = start.get(topic, {})
        if before is None or before == now or not any(int(o) > 0 for o in parts.values()):
            continue
        lost |= {(topic, p) for p in parts}
        why.append(f"{topic} was deleted and created again (its id changed from {before} to "
                   f"{now})")
    for topic, parts in sorted(ends.items()):
        for p, end in sorted(parts.items(), key=lambda kv: int(kv[0])):
            read = int(start.get(topic, {}).get(p, 0))
            if end < read and (topic, p) not in lost:
                lost.add((topic, p))
                why.append(f"{topic}/{p} ends at {end}, below the checkpoint's {read}")
                below[(topic, p)] = why[-1]
    return Loss(frozenset(lost), tuple(why), below)
