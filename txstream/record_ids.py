"""The id of every record the coordinator writes, ``tag.key.epoch.number``, and what it says.

The tag names the coordinator (its half topic): two coordinators releasing to one topic never
take each other's records for their own. A state key numbers its records from the batch time
of its first numbering (its epoch), so a replayed micro-batch gives every record the same id
again (docs/decisions/0005-replay-check.md). The id travels in the ``TXSTREAM_RECORD_ID``
header.
"""

from __future__ import annotations

import zlib

from txstream.topics import Topics

__all__ = ["coordinator_tag", "record_id", "id_tag"]


def coordinator_tag(topics: Topics) -> str:
    """Names this coordinator in record ids."""
    return f"{zlib.crc32(topics.half.encode('utf-8')):08x}"


def record_id(tag: str, key: int | str, epoch: int, number: int) -> str:
    """``tag.key.epoch.number``: unique per coordinator, equal in a replayed batch."""
    return f"{tag}.{key}.{epoch}.{number}"


def id_tag(record_id: str) -> str:
    """The coordinator tag of a record id (its first dotted part)."""
    return record_id.split(".", 1)[0]
