"""A bucket's state as bytes: one named layout per format version, written and read by name.

The state is a pickled tuple of plain values, so it does not depend on class paths: the
bucket's envelope, in it one row per held transaction, in a row the half message and the held
end events, in an end event the record it was read from. Which value sits at which position of
each is a :class:`Layout`, field by field, one per format version (:data:`LAYOUTS`). The current
layout writes; a blob is read through the layout of the version that wrote it, by name: a field
that version did not write takes its default in the classes of today, and a row whose length is
not its layout's is refused. (A field whose meaning changed needs a conversion of its own where
that layout is read.)

A field added to ``Message``, ``EndEvent``, ``RawRecord`` or ``Transaction`` needs a new layout
under a new version, the old one kept readable as long as a release wrote it:
``tests/state/test_state_codec.py`` fails until the current layout names every field, and decodes a
stored sample of every readable version (``tests/state/data/``). No version of txstream has been
released yet; formats 6 and 7 are read (docs/decisions/0026-state-formats.md).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from txstream.message import Decision, EndEvent, Message, RawRecord
from txstream.state.transaction import Status, Transaction

__all__ = ["FORMAT_VERSION", "LAYOUTS", "OUTCOME_STATUS_BITS", "Layout", "Share", "State",
           "MSG_BORN", "TX_DEADLINE", "TX_GROUP", "TX_HALF", "TX_ID", "TX_STATUS",
           "decode_state", "encode_state", "row_of", "sharer", "transaction_of"]


@dataclass(frozen=True, slots=True)
class Layout:
    """The fields of one format version, in the order they are written: the envelope
    (``bucket``, which starts with ``format``), a held transaction's row, its half message, a
    held end event and the record an end event was read from."""

    version: int
    bucket: tuple[str, ...]
    transaction: tuple[str, ...]
    message: tuple[str, ...]
    end_event: tuple[str, ...]
    raw_record: tuple[str, ...]


# 6: a transaction when it was registered, when its latest check was due, and why its body is
#    gone; a half message that knows where it lies in the half topic without its body.
FORMAT_6 = Layout(
    version=6,
    bucket=("format", "transactions", "epoch", "next_number", "outcomes"),
    transaction=("transaction_id", "status", "deadline", "producer_group", "half", "held",
                 "checks_sent", "checks_answered", "next_check", "last_answered",
                 "remember_until", "seen_at", "check_due", "body_gone"),
    message=("topic", "body", "tags", "keys", "properties", "transaction_id", "msg_id",
             "producer_group", "born_timestamp", "check_immunity_time_s", "queue_id",
             "queue_offset", "reconsume_times", "stored_timestamp"),
    end_event=("transaction_id", "producer_group", "decision", "from_check", "check_times",
               "operator", "remark", "born_timestamp", "raw"),
    raw_record=("partition", "offset", "key", "value", "headers"),
)

# 7: the outcomes of transactions that left the state keep their status in three bits, not
#    two: a lost release is remembered as LOST (its half message sent again is released).
FORMAT_7 = Layout(7, FORMAT_6.bucket, FORMAT_6.transaction, FORMAT_6.message,
                  FORMAT_6.end_event, FORMAT_6.raw_record)

# 8: an outcome may be IN_DOUBT (an id an earlier life may have released unnoted), and its
#    status has eight bits: room for new statuses without a new format.
FORMAT_8 = Layout(8, FORMAT_7.bucket, FORMAT_7.transaction, FORMAT_7.message,
                  FORMAT_7.end_event, FORMAT_7.raw_record)

FORMAT_VERSION = 8
LAYOUTS: dict[int, Layout] = {6: FORMAT_6, 7: FORMAT_7, 8: FORMAT_8}
# The bits of an outcome's status, by format (txstream.state.outcomes).
OUTCOME_STATUS_BITS = {6: 2, 7: 3, 8: 8}
_CURRENT = LAYOUTS[FORMAT_VERSION]

# Where the bucket reads a held row without decoding it (the current layout's positions).
TX_ID = _CURRENT.transaction.index("transaction_id")
TX_STATUS = _CURRENT.transaction.index("status")
TX_DEADLINE = _CURRENT.transaction.index("deadline")
TX_GROUP = _CURRENT.transaction.index("producer_group")
TX_HALF = _CURRENT.transaction.index("half")
MSG_BORN = _CURRENT.message.index("born_timestamp")


class State(NamedTuple):
    """A decoded envelope: its rows are still in ``layout``."""

    layout: Layout
    rows: list[tuple[Any, ...]]
    epoch: int | None
    next_number: int
    outcomes: Any  # Outcomes.encode()'s


def encode_state(rows: list[tuple[Any, ...]], epoch: int | None, next_number: int,
                 outcomes: Any) -> bytes:
    """The blob of a bucket whose rows are in the current layout."""
    values = {"format": FORMAT_VERSION, "transactions": rows, "epoch": epoch,
              "next_number": next_number, "outcomes": outcomes}
    return pickle.dumps(tuple(values[name] for name in _CURRENT.bucket), protocol=5)


def decode_state(blob: bytes) -> State:
    envelope = pickle.loads(blob)
    version = envelope[0] if isinstance(envelope, tuple) and envelope else None
    layout = LAYOUTS.get(version) if isinstance(version, int) else None
    if layout is None:
        raise ValueError(f"state format {version!r} is not one of {tuple(LAYOUTS)}: the "
                         "checkpoint was written by another version of txstream")
    fields = dict(zip(layout.bucket, _checked(envelope, layout.bucket, "state", layout.version)))
    for row in fields["transactions"]:  # rows are read in place before they are decoded
        _checked(row, layout.transaction, "transaction", layout.version)
    return State(layout, list(fields["transactions"]), fields["epoch"], fields["next_number"],
                 fields["outcomes"])


def _checked(row: tuple[Any, ...], names: tuple[str, ...], what: str, version: int
             ) -> tuple[Any, ...]:
    if len(row) != len(names):
        raise ValueError(f"a {what} of state format {version} has {len(row)} fields, its "
                         f"layout {len(names)}: the format changed without a new version")
    return row


# --- writing: the current layout --------------------------------------------------------------

Share = Callable[[Any], Any]


def sharer() -> Share:
    """Equal strings as one object, within one encoding. Pickle writes an object it has
    written before as a two-byte reference, but only the same object: a message's id, its
    ``UNIQ_KEY`` and often its keys are equal strings decoded from separate headers, and the
    topic and group repeat across a key's transactions. Shared, a held transaction with a
    200-byte body took 309 bytes of state instead of 390, and a key encoded a third faster;
    Spark copies every key's state on every micro-batch, so this is paid per batch."""
    seen: dict[str, str] = {}

    def share(value: Any) -> Any:
        return seen.setdefault(value, value) if isinstance(value, str) else value

    return share


def _compile(source: str, name: str, scope: dict[str, Any]) -> Any:
    """A function written from a layout: as fast as one written by hand (a generic loop over
    the names took twice as long to encode and decode a transaction), and never out of step
    with the layout."""
    exec(source, scope)  # the source is made from the layout's names, nothing else
    return scope[name]


# Fields written as shared strings (:func:`sharer`): ids, names and topics, which repeat.
_SHARED = frozenset({"topic", "tags", "keys", "transaction_id", "msg_id", "producer_group",
                     "operator"})


def _writer(names: tuple[str, ...], special: dict[str, Callable[[Any, Share], Any]]
            ) -> Callable[[Any, Share], tuple[Any, ...]]:
    """The values of an object as a tuple in the order of ``names``: each through its
    ``special`` conversion, shared (:data:`_SHARED`), or as it is."""
    def value(name: str) -> str:
        if name in special:
            return f"_{name}(o.{name}, share)"
        return f"share(o.{name})" if name in _SHARED else f"o.{name}"

    source = f"def write(o, share):\n    return ({', '.join(map(value, names))},)\n"
    write: Callable[[Any, Share], tuple[Any, ...]] = _compile(
        source, "write", {f"_{name}": f for name, f in special.items()})
    return write


def _properties(value: dict[str, str], share: Share) -> dict[str, str]:
    return {share(k): share(v) for k, v in value.items()}


_write_raw = _writer(_CURRENT.raw_record, {})
_write_message = _writer(_CURRENT.message, {"properties": _properties})
_MSG_BODY = _CURRENT.message.index("body")


def _message_row(m: Message | None, share: Share) -> tuple[Any, ...] | None:
    if m is None:
        return None
    row = _write_message(m, share)
    # A message that knows where it lies in the half topic is read back from there.
    if m.queue_id is not None and m.queue_offset is not None:
        row = (*row[:_MSG_BODY], None, *row[_MSG_BODY + 1:])
    return row


def _raw_row(raw: RawRecord | None, share: Share) -> tuple[Any, ...] | None:
    return None if raw is None else _write_raw(raw, share)


_write_end = _writer(_CURRENT.end_event, {"decision": lambda d, _: d.value, "raw": _raw_row})


def _held_rows(held: tuple[EndEvent, ...], share: Share) -> tuple[tuple[Any, ...], ...]:
    return tuple(_write_end(e, share) for e in held)


_write_tx = _writer(_CURRENT.transaction, {"status": lambda s, _: s.value,
                                           "half": _message_row, "held": _held_rows})


def row_of(tx: Transaction, share: Share) -> tuple[Any, ...]:
    """A held transaction's row in the current layout."""
    row: tuple[Any, ...] = _write_tx(tx, share)
    return row


# --- reading: by name, through the layout that wrote the row ----------------------------------

def _reader(cls: Callable[..., Any], names: tuple[str, ...],
            special: dict[str, Callable[[Any], Any]], what: str, version: int
            ) -> Callable[[tuple[Any, ...]], Any]:
    """Builds ``cls`` from a row of ``names``, by keyword: each value through its ``special``
    conversion or as it is. A row of another length is refused."""
    def value(i: int, name: str) -> str:
        return f"{name}=_{name}(row[{i}])" if name in special else f"{name}=row[{i}]"

    source = (f"def read(row):\n"
              f"    if len(row) != {len(names)}:\n"
              f"        _refuse(row)\n"
              f"    return _cls({', '.join(value(i, n) for i, n in enumerate(names))})\n")

    def refuse(row: tuple[Any, ...]) -> None:
        _checked(row, names, what, version)

    scope = {"_cls": cls, "_refuse": refuse, **{f"_{n}": f for n, f in special.items()}}
    read: Callable[[tuple[Any, ...]], Any] = _compile(source, "read", scope)
    return read


def _transaction_reader(layout: Layout) -> Callable[[tuple[Any, ...]], Any]:
    v = layout.version
    raw = _reader(RawRecord, layout.raw_record, {}, "held end event's record", v)
    end = _reader(EndEvent, layout.end_event,
                  {"decision": Decision, "raw": lambda r: None if r is None else raw(r)},
                  "held end event", v)
    message = _reader(Message, layout.message, {}, "half message", v)
    return _reader(Transaction, layout.transaction, {
        "status": Status,
        "half": lambda m: None if m is None else message(m),
        "held": lambda held: tuple(end(e) for e in held),
    }, "transaction", v)


_READERS: dict[Layout, Callable[[tuple[Any, ...]], Any]] = {}


def transaction_of(row: tuple[Any, ...], layout: Layout = _CURRENT) -> Transaction:
    """The transaction a row of ``layout`` holds."""
    read = _READERS.get(layout)
    if read is None:
        read = _READERS[layout] = _transaction_reader(layout)
    tx: Transaction = read(row)
    return tx
