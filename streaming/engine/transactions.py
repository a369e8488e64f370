"""Which path the sink's writes take (``--transactions auto|on|off``), decided once at start.

``on``: each sink task's records go in one Kafka transaction (docs/decisions/0032-transactions.md);
the coordinator refuses to start on a broker that does not isolate transactions. ``off``: the
ordered path, releases acknowledged before their notes (0030). ``auto``: ``on`` where the broker
isolates transactions, found out by a probe (:func:`txstream.kafka.transactions.probe_transactions`)
whose answer is kept in the checkpoint (``transactions.json``), per bootstrap servers: later
starts do not probe again.

The same file keeps the checkpoint's transactional id, from which each sink task's is made
(with its partition): stable across restarts, so a new attempt of a task fences a zombie one and
aborts what a killed one left open. A new checkpoint takes the coordinator's id (named after its
half topic, which only one coordinator reads), not one of its own: its tasks then fence the old
checkpoint's too, and abort what they left open. An id of its own left a killed task's
transaction open until its timeout (130 s by default), and every ``read_committed`` reader of
the partitions it wrote waited that long (the simulation's defect case 22).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import NamedTuple, Protocol

from txstream.errors import ConfigError, TransactionsUnavailable
from txstream.kafka.transactions import Isolation

__all__ = ["TRANSACTIONS_FILE", "MODES", "TransactionChoice", "TextStore", "choose",
           "choose_for_checkpoint", "probe_topic", "transactional_id_of"]

TRANSACTIONS_FILE = "transactions.json"
MODES = ("auto", "on", "off")


class TextStore(Protocol):
    """Where the answer is kept: the checkpoint (streaming.engine.checkpoint.Checkpoint)."""

    def read_text(self, name: str) -> str | None: ...
    def write_text(self, name: str, text: str) -> None: ...


class TransactionChoice(NamedTuple):
    """The path taken, the transactional id of the checkpoint (None when off) and why, as the
    coordinator says it at start."""

    on: bool
    transactional_id: str | None
    line: str


Probe = Callable[[], Isolation]


def probe_topic(history_topic: str) -> str:
    """The probe's topic: beside the history topic, with its prefix."""
    return f"{history_topic}_TXN_PROBE"


def _kept(store: TextStore) -> dict[str, object]:
    text = store.read_text(TRANSACTIONS_FILE)
    if text is None:
        return {}
    try:
        kept = json.loads(text)
    except ValueError:
        return {}  # damaged: probe again, and write it anew
    return kept if isinstance(kept, dict) else {}


def _isolation(kept: dict[str, object], servers: str, probe: Probe,
               store: TextStore) -> tuple[Isolation, bool]:
    """The broker's answer, kept or probed now (and kept); whether it was kept."""
    answer = kept.get("probe")
    if isinstance(answer, dict) and answer.get("servers") == servers:
        return Isolation(bool(answer.get("isolates")), str(answer.get("reason", ""))), True
    found = probe()
    kept["probe"] = {"servers": servers, "isolates": found.isolates, "reason": found.reason}
    store.write_text(TRANSACTIONS_FILE, json.dumps(kept, sort_keys=True) + "\n")
    return found, False


def transactional_id_of(half_topic: str) -> str:
    """The coordinator's transactional id: one coordinator reads a half topic."""
    return f"txstream-{half_topic}"


def _transactional_id(kept: dict[str, object], store: TextStore, base: str | None) -> str:
    """The one kept (a checkpoint made before ids were the coordinator's keeps its own), else
    ``base`` (else one of its own), kept from now on."""
    tid = kept.get("transactional_id")
    if isinstance(tid, str) and tid:
        return tid
    kept["transactional_id"] = tid = base or f"txstream-{uuid.uuid4().hex[:16]}"
    store.write_text(TRANSACTIONS_FILE, json.dumps(kept, sort_keys=True) + "\n")
    return tid


_OFF = "releases are acknowledged before their notes are sent"
_ON = "each sink task writes its records in one Kafka transaction"


def choose(mode: str, servers: str, store: TextStore, probe: Probe,
           base: str | None = None) -> TransactionChoice:
    """The path ``mode`` takes against the broker at ``servers``; raises
    TransactionsUnavailable for ``on`` against a broker that does not isolate transactions.
    ``base``: the transactional id a checkpoint takes (:func:`transactional_id_of`)."""
    if mode not in MODES:
        raise ConfigError(f"--transactions must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "off":
        return TransactionChoice(False, None, f"transactions off (--transactions off): {_OFF}")
    kept = _kept(store)
    try:
        isolation, was_kept = _isolation(kept, servers, probe, store)
    except TransactionsUnavailable as exc:
        if mode == "on":
            raise
        # Not kept: the next start asks again.
        return TransactionChoice(False, None, f"transactions off: {exc}: {_OFF}")
    known = " (as found before, kept in the checkpoint)" if was_kept else ""
    if not isolation.isolates:
        if mode == "on":
            raise TransactionsUnavailable(
                f"--transactions on, but {isolation.reason}{known}: run with "
                "--transactions auto or off on this broker")
        return TransactionChoice(False, None, f"transactions off: {isolation.reason}{known}: "
                                              f"{_OFF}")
    tid = _transactional_id(kept, store, base)
    how = "--transactions on" if mode == "on" else f"{isolation.reason}{known}"
    return TransactionChoice(True, tid, f"transactions on ({how}): {_ON} ({tid}-<partition>)")


def choose_for_checkpoint(spark: object, checkpoint_dir: str, mode: str, servers: str,
                          probe: Probe, half_topic: str) -> TransactionChoice:
    """:func:`choose`, its answer kept in the checkpoint at ``checkpoint_dir``."""
    from txstream.streaming.engine.checkpoint import Checkpoint

    return choose(mode, servers, Checkpoint(spark, checkpoint_dir), probe,
                  transactional_id_of(half_topic))
