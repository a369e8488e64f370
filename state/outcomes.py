"""The outcomes of transactions that left the state: 16 bytes each, kept for their reserved time.

A resolved transaction is kept whole for ``Policy.resolved_retention``, long enough for the
usual duplicates and late answers. After that only its outcome is kept, until
its half message is past the reserved time (when a re-read copy would be discarded as too old
anyway): a half message read again (offsets rewound, a producer re-sending) is then a duplicate,
not a second release, and a late end event is told the outcome it contradicts.

Each outcome is an 8-byte digest of the transaction id and 8 bytes of (until, status), in two
sorted numpy arrays: 16 bytes a transaction, against ~300 for a resolved ``Transaction``. Two
ids of one bucket (one time window of ids, ``txstream.state.keys``) with the same 64-bit digest
would share an outcome; at a million ids in one bucket the odds are 3 in 10^8.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = ["IN_DOUBT", "Outcomes", "OUTCOME_BITS", "OUTCOME_CODES"]

# No outcome but a warning: a coordinator before this state may have released the id's half
# message without noting so (docs/decisions/0029-releases-found.md). Any outcome replaces it.
IN_DOUBT = "IN_DOUBT"

# The resolved statuses and IN_DOUBT, by their code in the low bits (0 is not a status).
# Eight bits since state format 8: room for 250 more without a new format; the until (ms)
# above them keeps 55 bits, past the year 3000.
OUTCOME_BITS = 8
OUTCOME_CODES = ("", "COMMITTED", "ROLLED_BACK", "DISCARDED", "LOST", IN_DOUBT)
_CODE = {name: code for code, name in enumerate(OUTCOME_CODES) if name}
_MASK = (1 << OUTCOME_BITS) - 1


def _digest(transaction_id: str) -> int:
    raw = hashlib.blake2b(transaction_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


class Outcomes:
    """Transaction id → (status name, until), for ids no longer held whole. Pure: every
    time is given."""

    __slots__ = ("_keys", "_recent", "_values")

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype=np.int64)  # sorted digests
        self._values = np.empty(0, dtype=np.int64)  # until << 2 | status code
        self._recent: dict[int, int] = {}  # added since the arrays were last merged

    def __len__(self) -> int:
        self._merge()
        return len(self._keys)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Outcomes):
            return NotImplemented
        self._merge()
        other._merge()
        return bool(np.array_equal(self._keys, other._keys)
                    and np.array_equal(self._values, other._values))

    __hash__ = None  # type: ignore[assignment]

    def remember(self, transaction_id: str, status: str, until: int) -> None:
        self._recent[_digest(transaction_id)] = until << OUTCOME_BITS | _CODE[status]

    def recall(self, transaction_id: str, now: int) -> tuple[str, int] | None:
        """The status and until of ``transaction_id`` if it is remembered at ``now``."""
        digest = _digest(transaction_id)
        value = self._recent.get(digest)
        if value is None:
            i = int(np.searchsorted(self._keys, digest))
            if i == len(self._keys) or int(self._keys[i]) != digest:
                return None
            value = int(self._values[i])
        until = value >> OUTCOME_BITS
        return (OUTCOME_CODES[value & _MASK], until) if until > now else None

    def forget_expired(self, now: int) -> None:
        self._merge()
        alive = (self._values >> OUTCOME_BITS) > now
        if not alive.all():
            self._keys, self._values = self._keys[alive], self._values[alive]

    def last_until(self) -> int | None:
        """When the last outcome expires (None: none kept)."""
        self._merge()
        return int((self._values >> OUTCOME_BITS).max()) if len(self._values) else None

    def encode(self) -> tuple[bytes, bytes] | None:
        self._merge()
        return (self._keys.tobytes(), self._values.tobytes()) if len(self._keys) else None

    @classmethod
    def decode(cls, encoded: Any, bits: int = OUTCOME_BITS) -> Outcomes:
        """``encoded`` as :meth:`encode` gave it, its statuses in the low ``bits`` (a state
        format before 7 wrote two)."""
        outcomes = cls()
        if encoded:
            keys, values = encoded
            outcomes._keys = np.frombuffer(keys, dtype=np.int64)
            values = np.frombuffer(values, dtype=np.int64)
            if bits != OUTCOME_BITS:
                low = (1 << bits) - 1
                values = (values >> bits) << OUTCOME_BITS | (values & low)
            outcomes._values = values
        return outcomes

    def _merge(self) -> None:
        if not self._recent:
            return
        keys = np.fromiter(self._recent.keys(), dtype=np.int64, count=len(self._recent))
        values = np.fromiter(self._recent.values(), dtype=np.int64, count=len(self._recent))
        self._recent = {}
        # The newer value of a digest wins: stable sort, then keep the last of each run.
        keys = np.concatenate((self._keys, keys))
        values = np.concatenate((self._values, values))
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        last = np.ones(len(keys), dtype=bool)
        last[:-1] = keys[1:] != keys[:-1]
        self._keys, self._values = keys[last], values[last]
