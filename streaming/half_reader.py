"""Read half messages back from the half topic by position: what a parked transaction needs.

Runs in Spark's Python workers. One consumer per worker process and topic, kept across
micro-batches (workers are reused; connecting costs more than a read). Positions are read in
offset order per partition, so transactions parked together (neighbours in the log) cost one
fetch, not one each.

The log is immutable, so a replayed micro-batch reads exactly what its first run read. A half
message that is no longer there (the topic's retention is shorter than ``reserved-time``) fails
the batch with that reason: the transaction cannot be released or checked without it, and
dropping it silently is what txstream never does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from typing import Any

from txstream.errors import TxStreamError
from txstream.kafka import KafkaSettings, make_consumer
from txstream.message import Message
from txstream.wire import decode_half

__all__ = ["HalfReadError", "read_halves"]

_CONSUMERS: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()
_FETCH_BYTES = 1 << 20
_TIMEOUT_S = 30.0


class HalfReadError(TxStreamError, RuntimeError):
    """A parked transaction's half message could not be read back."""


def _consumer(settings: KafkaSettings) -> Any:
    key = (json.dumps(settings.as_dict(), sort_keys=True, default=str), "halves")
    with _LOCK:
        consumer = _CONSUMERS.get(key)
        if consumer is None:
            consumer = make_consumer(settings, fetch_max_wait_ms=5,
                                     max_partition_fetch_bytes=_FETCH_BYTES)
            _CONSUMERS[key] = consumer
        return consumer


def _drop(settings: KafkaSettings) -> None:
    key = (json.dumps(settings.as_dict(), sort_keys=True, default=str), "halves")
    with _LOCK:
        consumer = _CONSUMERS.pop(key, None)
    if consumer is not None:
        try:
            consumer.close()
        except Exception:  # broken already: closing is best effort
            pass


def read_halves(settings: KafkaSettings, topic: str,
                positions: Iterable[tuple[int, int]]) -> dict[tuple[int, int], Message]:
    """{(partition, offset): the half message there, with its position set}."""
    from kafka import TopicPartition

    wanted: dict[int, set[int]] = {}
    for partition, offset in positions:
        wanted.setdefault(partition, set()).add(offset)
    out: dict[tuple[int, int], Message] = {}
    if not wanted:
        return out
    consumer = _consumer(settings)
    try:
        for partition, offsets in sorted(wanted.items()):
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            todo = sorted(offsets)
            deadline = time.monotonic() + _TIMEOUT_S
            while todo:
                consumer.seek(tp, todo[0])
                got = False
                while not got:
                    if time.monotonic() > deadline:
                        raise HalfReadError(
                            f"{topic}/{partition}: half message at offset {todo[0]} not read "
                            f"within {_TIMEOUT_S:.0f} s (the half topic's retention must "
                            "outlast reserved-time)")
                    batch = consumer.poll(timeout_ms=20).get(tp, ())
                    for rec in batch:
                        got = True
                        if rec.offset in offsets and (partition, rec.offset) not in out:
                            msg = decode_half(rec.key, rec.value, rec.headers)
                            msg.queue_id, msg.queue_offset = partition, rec.offset
                            out[(partition, rec.offset)] = msg
                    if got:
                        last = batch[-1].offset
                        if todo[0] not in {r.offset for r in batch} and batch[0].offset > todo[0]:
                            raise HalfReadError(
                                f"{topic}/{partition}: half message at offset {todo[0]} is gone "
                                "(the half topic's retention must outlast reserved-time)")
                        todo = [o for o in todo if o > last]
    except HalfReadError:
        _drop(settings)
        raise
    except Exception as exc:
        _drop(settings)
        raise HalfReadError(f"reading half messages from {topic}: "
                            f"{type(exc).__name__}: {exc}") from exc
    return out
