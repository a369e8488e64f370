"""The consumer a reader of known ranges reads with: quick fetches until the broker is slow.

Readers of known ranges let the broker hold a fetch only ~5 ms (fast tails). A broker on slow
storage (tansu on S3) answers such fetches empty while it is still reading, again and again;
:func:`txstream.kafka.reading.read_range` then asks for a patient consumer (a fetch wait of
``PATIENT_FETCH_WAIT_MS``), and from then on this reader stays patient.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from txstream.kafka.clients import PATIENT_FETCH_WAIT_MS, ClientSlot, make_consumer
from txstream.kafka.protocols import Consumer
from txstream.kafka.settings import KafkaSettings

__all__ = ["PatientConsumer", "forget_patience"]

FAST_FETCH_WAIT_MS = 5  # the broker answers a fetch at the end of the log at once

# Kept readers that met slow storage: patient for the rest of the process.
_PATIENT_KEYS: set[Hashable] = set()


def forget_patience() -> None:
    """Kept readers start quick again (a simulated process restart)."""
    _PATIENT_KEYS.clear()


class PatientConsumer:
    """``reader(patient)`` gives the consumer to read with (read_range's ``consumer_for``).

    ``kept_as``: the consumer is the process's, kept under that key (``cached_client``) for
    the next reader with the same key, and so is its patience; without it the consumer is
    this reader's own, closed by :meth:`close`. ``options`` go to ``make_consumer``.
    """

    def __init__(self, settings: KafkaSettings, *, role: str | None = None,
                 kept_as: Hashable | None = None, **options: Any) -> None:
        self._settings, self._role, self._options = settings, role, options
        self._key = kept_as
        self._slot = ClientSlot(self._make, kept_as)
        self._patient = False

    @property
    def patient(self) -> bool:
        return self._key in _PATIENT_KEYS if self._key is not None else self._patient

    def __call__(self, patient: bool = False) -> Consumer:
        if patient and not self.patient:
            self.drop()
            if self._key is not None:
                _PATIENT_KEYS.add(self._key)
            else:
                self._patient = True
        return self._slot.get()

    def _make(self) -> Consumer:
        wait_ms = PATIENT_FETCH_WAIT_MS if self.patient else FAST_FETCH_WAIT_MS
        return make_consumer(self._settings, role=self._role, fetch_max_wait_ms=wait_ms,
                             **self._options)

    def drop(self) -> None:
        """Forget the consumer (after an error: it may be in a state it does not recover
        from); the next call makes a new one."""
        self._slot.drop()

    def close(self) -> None:
        """Close this reader's own consumer (a kept one stays the process's)."""
        self._slot.close()

    def __enter__(self) -> PatientConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
