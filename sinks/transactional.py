"""Sending one task's records in one Kafka transaction (``--transactions on``).

Where the broker isolates transactions, a task's releases, history notes, check requests,
discards and dead letters are committed together or not at all: a batch that fails leaves
nothing a ``read_committed`` reader sees, and its replay writes it whole
(docs/decisions/0032-transactions.md). Within the transaction the notes still go after the
rest is acknowledged: a refused release's note says so, with where its dead letter lies.

A record the broker refuses for what it is (:func:`txstream.sinks.delivery.refused_by_broker`)
spoils the transaction: it is aborted, and the task's records are sent again in a new one,
the refused record replaced by its dead letter. Each task's transactional id is the
checkpoint's (given by the driver) and its partition: a new attempt of the task fences an
older one, and ``init_transactions`` aborts what a killed one left open.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable

from txstream.errors import SendFailed
from txstream.kafka import KafkaSettings, Producer, cached_client, drop_cached_client
from txstream.kafka.transactions import (
    commit_within,
    fenced,
    learn_topics,
    make_transactional_producer,
)
from txstream.outputs import KAFKA_MAX_MESSAGE_BYTES
from txstream.schema import Kind
from txstream.sinks.delivery import (
    Delivery,
    Prepared,
    Stalled,
    flush_watching,
    restated_note,
    unacknowledged,
    wait_ms,
)
from txstream.topics import Topics

__all__ = ["TransactionalDelivery", "Fenced", "task_transactional_id"]

_MAX_ERRORS_SHOWN = 3
# New producers a task's transaction is sent with after one stalled (sinks.delivery.Stalled).
_STALL_RENEWALS = 2

log = logging.getLogger(__name__)


class Fenced(SendFailed):
    """Another producer took this task's transactional id: nothing of this transaction is
    committed. The producer is dropped; the next one made fences the other in turn."""


def task_transactional_id(base: str) -> str:
    """The running task's transactional id: the checkpoint's and the sink partition."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"{base}-{context.partitionId() if context is not None else 0}"


class TransactionalDelivery(Delivery):
    """The records of one task, held until :meth:`finish` sends them in one transaction."""

    def __init__(self, settings: KafkaSettings, flush_timeout_s: float, transactional_id: str,
                 dead_letter_topic: str | None = None,
                 max_message_bytes: int = KAFKA_MAX_MESSAGE_BYTES,
                 half_topic: str | None = None) -> None:
        super().__init__(settings, flush_timeout_s, dead_letter_topic, max_message_bytes,
                         half_topic)
        self.transactional_id = transactional_id
        self.records: list[Prepared] = []  # all but the notes, in the order given
        self.replacements: set[int] = set()  # ids of the dead letters of refused records

    def _key(self) -> tuple[str, str, str, int]:
        return ("sink-tx", self.transactional_id, self.settings.key,
                self.limit)

    def _producer(self) -> Producer:
        # A task may take longer than Kafka's 60-s default before it commits: its flush may.
        timeout_ms = max(60_000, int(self.flush_timeout_s * 1000) + 10_000)
        return cached_client(self._key(), lambda: make_transactional_producer(
            self.settings, self.transactional_id, role="sink",
            batch_size=min(1 << 20, self.limit), max_request_size=self.limit,
            max_in_flight_requests_per_connection=1, transaction_timeout_ms=timeout_ms))

    def _drop_producer(self) -> None:
        drop_cached_client(self._key())

    def renew(self) -> Producer:
        """A new producer for this id: it fences every earlier one and aborts the transaction
        a killed attempt left open (which holds back read_committed readers till then)."""
        self._drop_producer()
        return self._producer()

    def send(self, rows: Iterable[Prepared]) -> None:
        for prepared in rows:
            if prepared[0].kind == Kind.HISTORY:
                self.notes.append(prepared)
            else:
                self.records.append(prepared)

    def finish(self) -> dict[str, int]:
        """Send everything in one transaction and commit it; a refused record's transaction
        is aborted and everything sent again in a new one, with its dead letter instead.
        Raises SendFailed (Fenced) unless the transaction committed."""
        records, notes = self.records, self.notes
        for _ in range(len(records) + len(notes) + 1):  # each round replaces a record
            refused = self._attempt_renewing(records, notes)
            if not refused:
                return +self.counts
            records, notes = self._replaced(records, notes, refused)
        raise SendFailed("the broker refused the dead letters of refused records too")

    def _attempt_renewing(self, records: list[Prepared], notes: list[Prepared]
                          ) -> list[tuple[Prepared, BaseException]]:
        """:meth:`_attempt`, sent again with a new producer when the last one stalled: the
        new one's ``init_transactions`` fences the wedged one and aborts its transaction, so
        nothing of it is ever read_committed (a commit in doubt is never sent again)."""
        for renewals in range(_STALL_RENEWALS + 1):
            try:
                return self._attempt(records, notes)
            except Stalled as exc:
                if renewals == _STALL_RENEWALS:
                    raise
                log.warning("transaction %s: %s; sent again with a new producer",
                            self.transactional_id, exc)
                self.renew()
        raise AssertionError("unreachable: the last round returns or raises")

    def _attempt(self, records: list[Prepared], notes: list[Prepared]
                 ) -> list[tuple[Prepared, BaseException]]:
        """One transaction: records, then notes; committed unless a record was refused
        (then aborted, and the refusals returned)."""
        self.counts, self.futures, self.refused = Counter(), [], []
        # A new producer (this id last ran in another worker process) asks for all topics at once.
        learn_topics(self._producer(), {row.topic for row, _ in (*records, *notes)})
        producer = self._call("begin", lambda p: p.begin_transaction())
        self._send(records)
        if refused := self._acknowledged_or_refused():
            return self._aborted(producer, refused)
        self._note_dead_letters()
        self.futures = []
        self._send([restated_note(note, self.restated) for note in notes]
                   if self.restated else notes)
        if refused := self._acknowledged_or_refused():
            return self._aborted(producer, refused)
        self._call("commit", lambda p: commit_within(p, self.flush_timeout_s))
        return []

    def _send(self, records: list[Prepared]) -> None:
        """The records due now, then each held one at its deadline, in deadline order."""
        def due(row: Prepared) -> int | None:
            at = row[0].not_before_ms
            return at if at is not None and wait_ms(at, row[0].batch_ms) > 0 else None

        held = sorted((r for r in records if due(r) is not None), key=lambda r: due(r) or 0)
        try:
            self._send_now([r for r in records if due(r) is None])
            for prepared in held:
                wait = wait_ms(prepared[0].not_before_ms or 0, prepared[0].batch_ms)
                if wait > 0:
                    time.sleep(wait / 1000)
                self._send_now([prepared])
        except SendFailed as exc:  # the producer was dropped, its transaction left open
            if exc.__cause__ is not None and fenced(exc.__cause__):
                raise Fenced(str(exc)) from exc.__cause__
            raise

    def _call(self, what: str, call: object) -> Producer:
        producer = self._producer()
        try:
            call(producer)  # type: ignore[operator]
        except Exception as exc:
            self._drop_producer()
            kind = Fenced if fenced(exc) else SendFailed
            raise kind(f"{what} transaction {self.transactional_id} failed: "
                       f"{type(exc).__name__}: {exc}") from exc
        return producer

    def _flush(self) -> None:
        """Flush. kafka-python's flush raises once a transaction has an error (a record
        refused); each record's outcome is then in its future, waited for here."""
        try:
            flush_watching(self._producer(), (f for _, f in self.futures), self.flush_timeout_s)
            return
        except Stalled:
            self._drop_producer()
            raise
        except Exception as exc:
            error = exc
        deadline = time.monotonic() + self.flush_timeout_s
        for _, future in self.futures:
            while not future.is_done and time.monotonic() < deadline:
                time.sleep(0.005)
        if not all(future.is_done for _, future in self.futures):
            self._drop_producer()
            raise SendFailed(f"flushing {len(self.futures)} records of transaction "
                             f"{self.transactional_id} failed: {type(error).__name__}: "
                             f"{error}") from error

    def _acknowledged_or_refused(self) -> list[tuple[Prepared, BaseException]]:
        """Flush; the records refused for what they are. Raises SendFailed (or Fenced) if any
        other was not acknowledged."""
        self._flush()
        refused, failed = unacknowledged(self.futures)
        self.refused.extend(refused)
        if failed:
            self._drop_producer()  # its transaction stays open: the next producer aborts it
            kind = Fenced if any(e is not None and fenced(e) for _, e in failed) else SendFailed
            shown = "; ".join(f"{topic}: {exc or 'no acknowledgement'}"
                              for topic, exc in failed[:_MAX_ERRORS_SHOWN])
            raise kind(f"{len(failed)} of {len(self.futures)} records of transaction "
                       f"{self.transactional_id} were not acknowledged: {shown}")
        return self.refused

    def _aborted(self, producer: Producer, refused: list[tuple[Prepared, BaseException]]
                 ) -> list[tuple[Prepared, BaseException]]:
        if self.dead_letter_topic is None:
            self._drop_producer()
            (row, _), exc = refused[0]
            raise SendFailed(f"the broker refused a record for {row.topic} and the sink has no "
                             f"dead-letter topic: {type(exc).__name__}: {exc}")
        self._call("abort", lambda p: p.abort_transaction())
        # A refused batch leaves kafka-python's sequence numbers behind the broker's: the next
        # transaction would be refused out of order. A new producer starts them afresh.
        self._drop_producer()
        return refused

    def _replaced(self, records: list[Prepared], notes: list[Prepared],
                  refused: list[tuple[Prepared, BaseException]]
                  ) -> tuple[list[Prepared], list[Prepared]]:
        """``records`` and ``notes`` with each refused one's dead letter in its place (the
        notes' at the end of the records: a dead letter is no note)."""
        assert self.dead_letter_topic is not None
        if any(id(p) in self.replacements for p, _ in refused):
            raise SendFailed(f"{len(refused)} records refused by the broker could not be "
                             "dead-lettered either")
        topics = Topics(dead_letter=self.dead_letter_topic)
        instead = {id(p): self._dead_letter(p, exc, topics) for p, exc in refused}
        self.replacements |= {id(p) for p in instead.values()}
        kept = [instead.get(id(p), p) for p in records]
        kept += [instead[id(p)] for p in notes if id(p) in instead]
        return kept, [p for p in notes if id(p) not in instead]

    def _note_dead_letters(self) -> None:
        """Where each refused release's dead letter lies, for its note."""
        for (row, _), future in self.futures:
            txid = row.key.decode("utf-8", "replace") if row.key is not None else ""
            if row.kind == Kind.DEAD_LETTER and txid in self.restated and future.value:
                where = future.value
                self.restated[txid]["dead_letter"] = f"{where.partition}@{where.offset}"
