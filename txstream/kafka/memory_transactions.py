"""Kafka transactions (KIP-98) of the in-memory broker (:mod:`txstream.kafka.memory`), kept as
Apache Kafka keeps them, in three places:

- :class:`PartitionTransactions`, one per partition (Kafka's producer state and aborted
  transaction index): the records each open transaction wrote there (the first of the oldest
  is where the partition stops being stable: the last stable offset), the offsets of aborted
  records, and those of the markers that ended transactions (a marker takes an offset and is
  no record: fetches step over it).
- :class:`TransactionCoordinator`, one per broker (Kafka's transaction coordinator): each
  transactional id's producer id and epoch, and its open transaction's partitions and start.
  A new producer of an id bumps the epoch, which fences the older one, and aborts what it left
  open; a transaction open longer than its producer's ``transaction_timeout_ms`` by the
  broker's clock is aborted, its producer fenced, as Kafka's coordinator does (here lazily:
  whenever the broker is asked or written to).
- :class:`TransactionManager`, one per transactional producer (kafka-python's): the states of
  ``init_transactions``, ``begin_transaction``, ``commit_transaction`` and
  ``abort_transaction``, and the error states: abortable (a send of the transaction failed:
  only an abort may follow) and fatal (the producer was fenced: nothing may follow).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from txstream.kafka.errors import (
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
)

if TYPE_CHECKING:
    from txstream.kafka.memory import MemoryBroker
    from txstream.kafka.memory_log import PartitionLog

__all__ = ["MAX_TRANSACTION_TIMEOUT_MS", "ProducerToken", "PartitionTransactions",
           "TransactionCoordinator", "TransactionManager"]

MAX_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms


class ProducerToken(NamedTuple):
    """Who writes in a transaction: the id, and the producer id and epoch its
    ``init_transactions`` got."""

    transactional_id: str
    producer_id: int
    epoch: int


@dataclass
class _Open:
    first: int  # the transaction's first offset here (never below the log start)
    offsets: list[int]  # its records here, aborted with it


class PartitionTransactions:
    """One partition's transactions: open ones by producer id, aborted records, markers."""

    def __init__(self) -> None:
        self.open: dict[int, _Open] = {}
        self.aborted: set[int] = set()
        self.markers: dict[int, bool] = {}  # offset -> whether it commits

    def wrote(self, producer_id: int, offset: int) -> None:
        found = self.open.get(producer_id)
        if found is None:
            self.open[producer_id] = _Open(offset, [offset])
        else:
            found.offsets.append(offset)

    def ended(self, producer_id: int, marker: int, commit: bool) -> None:
        """The producer's transaction ended with a marker at ``marker``."""
        found = self.open.pop(producer_id, None)
        if found is not None and not commit:
            self.aborted.update(found.offsets)
        self.markers[marker] = commit

    def first_unstable(self) -> int | None:
        """The first offset of the oldest open transaction (None: none is open)."""
        return min((found.first for found in self.open.values()), default=None)

    def prune(self, start: int) -> None:
        """Forget what lies below the log start. An open transaction stays open: its first
        offset becomes the log start, as Kafka's last stable offset never lies below it."""
        self.aborted = {o for o in self.aborted if o >= start}
        self.markers = {o: c for o, c in self.markers.items() if o >= start}
        for found in self.open.values():
            found.first = max(found.first, start)
            found.offsets = [o for o in found.offsets if o >= start]


@dataclass
class _Id:
    """A transactional id as the coordinator keeps it."""

    producer_id: int
    epoch: int
    timeout_ms: int
    logs: list[PartitionLog] = field(default_factory=list)  # the open transaction's
    started_ms: int | None = None  # when its first partition was added (None: none open)


class TransactionCoordinator:
    """The broker's transaction coordinator. ``clock()``: the broker's time (ms)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self._ids: dict[str, _Id] = {}
        self._next_producer_id = 0

    def init_producer(self, transactional_id: str, timeout_ms: int) -> ProducerToken:
        """InitProducerId: the id's producer id with the next epoch (the first time, a new
        producer id); what an earlier producer of the id left open is aborted."""
        from kafka.errors import InvalidTransactionTimeoutError

        self.expire()
        if not 0 < timeout_ms <= MAX_TRANSACTION_TIMEOUT_MS:
            raise InvalidTransactionTimeoutError(
                f"transaction_timeout_ms {timeout_ms} is not within (0, "
                f"{MAX_TRANSACTION_TIMEOUT_MS}] (transaction.max.timeout.ms)")
        found = self._ids.get(transactional_id)
        if found is None:
            found = self._ids[transactional_id] = _Id(self._next_producer_id, -1, timeout_ms)
            self._next_producer_id += 1
        self._end(found, commit=False)
        found.epoch += 1
        found.timeout_ms = timeout_ms
        return ProducerToken(transactional_id, found.producer_id, found.epoch)

    def check(self, token: ProducerToken) -> _Id:
        """The id's state; ProducerFencedError if a newer producer (or the transaction
        timeout) took it from ``token``'s."""
        self.expire()
        found = self._ids.get(token.transactional_id)
        if found is None or (found.producer_id, found.epoch) != token[1:]:
            raise ProducerFencedError(f"transactional id {token.transactional_id}: producer "
                                      f"{token.producer_id} epoch {token.epoch} was fenced by a "
                                      "newer one")
        return found

    def add_partition(self, token: ProducerToken, log: PartitionLog) -> None:
        """AddPartitionsToTxn: the partition gets a marker when the transaction ends. The
        first one starts the transaction (and its timeout)."""
        found = self.check(token)
        if found.started_ms is None:
            found.started_ms = self.clock()
        if not any(known is log for known in found.logs):
            found.logs.append(log)

    def end(self, token: ProducerToken, commit: bool) -> None:
        """EndTxn: a COMMIT or ABORT marker in each partition of the transaction."""
        self._end(self.check(token), commit)

    def _end(self, found: _Id, commit: bool) -> None:
        for log in found.logs:
            log.append_marker(found.producer_id, commit)
        found.logs, found.started_ms = [], None

    def expire(self) -> None:
        """Abort each transaction open longer than its timeout, fencing its producer (Kafka's
        coordinator bumps the epoch as it aborts: the producer cannot commit it after all)."""
        now = self.clock()
        for found in self._ids.values():
            if found.started_ms is not None and now - found.started_ms > found.timeout_ms:
                self._end(found, commit=False)
                found.epoch += 1

    def open_since(self, transactional_id: str) -> int | None:
        """When the id's open transaction started (None: none is open)."""
        self.expire()
        found = self._ids.get(transactional_id)
        return None if found is None else found.started_ms


class TransactionManager:
    """kafka-python 3.0.12's ``TransactionManager`` as the memory producer uses it: its
    states and transitions (kafka-python's own ``TransactionState``), its errors and
    messages, and its requests to the broker's coordinator (InitProducerId, EndTxn).
    Where kafka-python would wait for ever on a broker that is down (the end of a
    transaction), this one raises ``KafkaTimeoutError`` and the call may be made again, as
    Java's producer allows."""

    def __init__(self, transactional_id: str, timeout_ms: int) -> None:
        from kafka.producer.transaction_manager import TransactionState

        self.states = TransactionState
        self.transactional_id, self.timeout_ms = transactional_id, timeout_ms
        self.state = TransactionState.UNINITIALIZED
        self.token: ProducerToken | None = None
        self.last_error: BaseException | None = None
        self.started = False  # a partition was added: the broker knows the transaction

    @classmethod
    def configured(cls, config: dict[str, Any], given: dict[str, Any]
                   ) -> TransactionManager | None:
        """A producer's, if its ``config`` has a transactional id (None: it has not), after
        kafka-python's checks of the configs ``given``: idempotent, acks=all."""
        from kafka.errors import KafkaConfigurationError

        if not config["transactional_id"]:
            return None
        if "enable_idempotence" in given and not given["enable_idempotence"]:
            raise KafkaConfigurationError("Cannot set transactional_id without "
                                          "enable_idempotence.")
        if given.get("acks", -1) not in (-1, "all"):
            raise KafkaConfigurationError("enable_idempotence=True is incompatible with "
                                          f"user-provided acks={given['acks']!r}")
        return cls(str(config["transactional_id"]), int(config["transaction_timeout_ms"]))

    def transition(self, target: int) -> None:
        if not self.states.is_transition_valid(self.state, target):
            raise KafkaError(f"TransactionalId {self.transactional_id}: Invalid transition "
                             f"attempted from state {self.state.name} to state "
                             f"{self.states(target).name}")
        self.last_error = None
        self.state = self.states(target)

    def has_error(self) -> bool:
        return self.state in (self.states.ABORTABLE_ERROR, self.states.FATAL_ERROR)

    def fail_if_error(self) -> None:
        if self.has_error():
            raise KafkaError("Cannot execute transactional method because we are in an error "
                             f"state: {self.last_error}")

    def init(self, broker: MemoryBroker, max_block_ms: int) -> None:
        """``init_transactions``: once done, a second call does nothing (as kafka-python)."""
        if self.token is not None:
            return
        if broker.down:
            raise KafkaTimeoutError("Timeout expired while initializing transactional state "
                                    f"in {max_block_ms} ms.")
        self.transition(self.states.INITIALIZING)
        try:
            self.token = broker.transactions.init_producer(self.transactional_id,
                                                           self.timeout_ms)
        except KafkaError as exc:
            self.state, self.last_error = self.states.FATAL_ERROR, exc
            raise
        self.transition(self.states.READY)

    def begin(self) -> None:
        self.fail_if_error()
        self.transition(self.states.IN_TRANSACTION)

    def begin_commit(self) -> None:
        if self.state != self.states.COMMITTING_TRANSACTION:  # else a retry after a timeout
            self.fail_if_error()
            self.transition(self.states.COMMITTING_TRANSACTION)

    def begin_abort(self) -> None:
        if self.state != self.states.ABORTING_TRANSACTION:  # else a retry after a timeout
            if self.state != self.states.ABORTABLE_ERROR:
                self.fail_if_error()
            self.transition(self.states.ABORTING_TRANSACTION)

    def check_send(self) -> ProducerToken:
        """kafka-python's ``_fail_if_not_ready_for_send``: a send needs an open transaction."""
        if self.has_error():
            raise KafkaError("Cannot perform send because at least one previous transactional "
                             "or idempotent request has failed with errors.", self.last_error)
        if self.token is None:
            raise IllegalStateError("Cannot perform a 'send' before completing a call to "
                                    "init_transactions when transactions are enabled.")
        if self.state != self.states.IN_TRANSACTION:
            raise IllegalStateError(f"Cannot call send in state {self.state.name}")
        return self.token

    def failed(self, exc: BaseException) -> None:
        """A request of the transaction failed: fenced is fatal, anything else abortable (an
        abort under way stays one)."""
        if isinstance(exc, ProducerFencedError):
            self.state, self.last_error = self.states.FATAL_ERROR, exc
        elif self.state != self.states.ABORTING_TRANSACTION and not self.has_error():
            self.state, self.last_error = self.states.ABORTABLE_ERROR, exc

    def end(self, broker: MemoryBroker, commit: bool) -> None:
        """EndTxn, once the records are delivered or failed: the error of one that failed
        fails a commit. kafka-python sends none for a transaction no partition joined."""
        if commit and self.has_error():
            raise self.last_error or KafkaError("the transaction failed")
        if self.started:
            if broker.down:
                raise KafkaTimeoutError(f"Timeout waiting for the end of transaction "
                                        f"{self.transactional_id}: the broker is down")
            assert self.token is not None
            try:
                broker.transactions.end(self.token, commit)
            except ProducerFencedError as exc:
                self.failed(exc)
                raise
        self.transition(self.states.READY)
        self.started = False
