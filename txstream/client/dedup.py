"""A bounded memory of message ids already consumed (LRU with a time to live).

The coordinator may release a message twice (a replayed micro-batch, a restart); consumers
drop the second copy by its ``UNIQ_KEY``. The memory is bounded in size and age, so a
duplicate arriving after ``ttl_s`` or after ``capacity`` newer ids gets through: this is
at-least-once delivery with duplicates made rare, not exactly-once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

__all__ = ["DedupCache"]


class DedupCache:
    def __init__(
        self,
        capacity: int = 100_000,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 0 or ttl_s <= 0:
            raise ValueError("capacity must be >= 0 and ttl_s > 0")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # id -> when added, oldest first

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, msg_id: object) -> bool:
        if not isinstance(msg_id, str):
            return False
        added = self._seen.get(msg_id)
        if added is None:
            return False
        if self._clock() - added >= self.ttl_s:
            del self._seen[msg_id]
            return False
        return True

    def add(self, msg_ids: Iterable[str | None]) -> None:
        now = self._clock()
        for msg_id in msg_ids:
            if not msg_id or self.capacity == 0:
                continue
            self._seen[msg_id] = now
            self._seen.move_to_end(msg_id)
        self._evict(now)

    def _evict(self, now: float) -> None:
        while self._seen:
            oldest, added = next(iter(self._seen.items()))
            if len(self._seen) > self.capacity or now - added >= self.ttl_s:
                del self._seen[oldest]
            else:
                break
