"""The sink's side of held half messages: their bodies, read back into the records it writes.

A release, check request or discard of a half message held without its body comes to the sink
with a null value and where the body lies (``OutputRow.body_partition``, ``body_offset``): big
bodies never pass through the JVM. (A row with a value says where its body lies too: a
refused release's dead letter names it.) A task reads all the bodies its rows need at once
(:class:`txstream.sources.bodies.BodySource`), and each record read serves every row that needs it.

The operator read each of them before deciding, and told the core of any that was gone
(docs/decisions/0022-trusted-time.md). One that cannot be read back now was lost since,
within the batch (its half topic deleted or cut meanwhile): the batch fails, and its replay
decides again with what is there, so that the history never says "released" for a message
that was not.
"""

from __future__ import annotations

from collections.abc import Sequence

from txstream.errors import SendFailed
from txstream.kafka import Unreadable
from txstream.schema import OutputRow
from txstream.sources.bodies import OTHER_RECORD, BodySource
from txstream.wire import H

__all__ = ["needs_body", "with_bodies"]

Prepared = tuple[OutputRow, list[tuple[str, bytes]]]


def _body_at(row: OutputRow) -> tuple[int, int] | None:
    """(partition, offset) in the half topic of the body to read back into ``row``, if any."""
    if row.value is None and row.body_offset is not None and row.body_partition is not None:
        return (row.body_partition, row.body_offset)
    return None


def needs_body(row: OutputRow) -> bool:
    return _body_at(row) is not None


def _transaction_id(row: OutputRow, headers: Sequence[tuple[str, bytes]]) -> bytes | None:
    """The transaction a row is for: a release names it in a header, a check or a discard in
    its key."""
    for name, value in headers:
        if name == H.TRANSACTION_ID:
            return value
    return row.key


def with_bodies(source: BodySource | None, rows: list[Prepared]) -> list[Prepared]:
    """``rows`` with every body that lies in the half topic read back into its value."""
    wanted: dict[int, set[int]] = {}
    for row, _ in rows:
        if (at := _body_at(row)) is not None:
            wanted.setdefault(at[0], set()).add(at[1])
    if not wanted:
        return rows
    if source is None:
        raise SendFailed("records whose bodies lie in the half topic need the sink's option "
                         "half_topic")
    found = source.read(wanted)
    out: list[Prepared] = []
    for prepared in rows:
        row, headers = prepared
        at = _body_at(row)
        if at is None:
            out.append(prepared)
            continue
        rec = found.get(at)
        if rec is None:
            why = source.why_missing(at[0])
        elif isinstance(rec, Unreadable):
            why = f"cannot be read: {rec.error}"
        elif rec.key != _transaction_id(row, headers):
            why = OTHER_RECORD
        else:
            out.append((row._replace(value=rec.value), headers))
            continue
        raise SendFailed(f"the body of the {row.kind} record for {row.topic}, "
                         f"{source.topic}/{row.body_partition} offset {row.body_offset}, {why} "
                         f"since it was read in this batch: the batch runs again")
    return out
