"""How long the source waits, when its input is quiet, before it asks the broker again.

Spark asks a source for its latest offset again every ``pollingDelay`` (50 ms) while nothing
has moved, and each ask is a round of fetches to learn where the partitions end (tansu answers
``ListOffsets`` wrongly). After :data:`QUIET_AFTER_MS` without new records the source waits up
to :data:`IDLE_WAIT_MS` before it asks, never past the next due timer, so an idle coordinator
asks about a fifth as often. The first record after a quiet spell waits half of it on average;
under load the input is never quiet and nothing waits
(docs/decisions/0028-idle-wait.md).
"""

from __future__ import annotations

__all__ = ["QUIET_AFTER_MS", "IDLE_WAIT_MS", "idle_wait_ms"]

QUIET_AFTER_MS = 500
IDLE_WAIT_MS = 200


def idle_wait_ms(quiet_since: int | None, next_due: int | None, now: int,
                 wait_ms: int = IDLE_WAIT_MS, quiet_after_ms: int = QUIET_AFTER_MS) -> int:
    """Milliseconds to wait before asking the broker: 0 unless the input has been quiet
    (nothing new) since ``quiet_since`` for ``quiet_after_ms``; at most ``wait_ms``, and not
    past ``next_due``, the next timer's due time (None: none)."""
    if wait_ms <= 0 or quiet_since is None or now - quiet_since < quiet_after_ms:
        return 0
    if next_due is not None:
        return max(0, min(wait_ms, next_due - now))
    return wait_ms
