"""An operator's decision for one transaction, written to the end topic: what
``txstream resolve`` and the console's resolve buttons send.

It carries ``ADMIN_OPERATOR`` and goes through the end topic producers use, so the coordinator
applies it like any other end event (in order, checkpointed) and records it in the history as
the operator's decision.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from txstream.errors import SendFailed
from txstream.kafka import KafkaSettings, make_producer
from txstream.message import Decision, EndEvent
from txstream.topics import Topics, validate_group
from txstream.wire import encode_end

__all__ = ["send_decision", "Written", "ADMIN_GROUP"]

ADMIN_GROUP = "txstream-admin"


class Written(NamedTuple):
    """Where an operator's decision was written, and when."""

    topic: str
    partition: int
    offset: int
    born_ms: int


def send_decision(settings: KafkaSettings, topics: Topics, txid: str, decision: Decision,
                  operator: str, reason: str | None = None, group: str = ADMIN_GROUP
                  ) -> Written:
    """Write an operator's decision for ``txid`` to the end topic, with ``ADMIN_OPERATOR``
    and the remark: the coordinator applies it in order and records it as the operator's."""
    born = int(time.time() * 1000)
    event = EndEvent(txid, validate_group(group), decision, operator=operator, remark=reason,
                     born_timestamp=born)
    record = encode_end(event, topics)
    producer = make_producer(settings)
    try:
        meta = producer.send(record.topic, key=record.key, value=record.value,
                             headers=list(record.headers)).get(timeout=30)
    except Exception as exc:
        raise SendFailed(f"end event for {txid} not acknowledged: {exc}") from exc
    finally:
        producer.close(timeout=5)
    return Written(meta.topic, meta.partition, meta.offset, born)
