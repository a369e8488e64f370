"""The one schema module: the rows that flow through the coordinator's streaming query.

    Kafka (half + end topics)
      -> sources.kafka_source  rows of EVENT_SCHEMA (one per record, parsed, or 'malformed')
      -> streaming.operator    applyInPandasWithState keyed by ``bucket``, state STATE_SCHEMA
      -> rows of OUTPUT_SCHEMA (one per record to write, routed by ``kind``)
      -> sinks.kafka_sink      Kafka (real topics, check topics, discard, dead letter, history)

Kept as DDL strings so that importing this module needs no JVM.
"""

from __future__ import annotations

__all__ = [
    "EVENT_SCHEMA",
    "EVENT_COLUMNS",
    "OUTPUT_SCHEMA",
    "OUTPUT_COLUMNS",
    "STATE_SCHEMA",
    "Kind",
    "EventKind",
]


class EventKind:
    """Values of EVENT_SCHEMA.kind."""

    HALF = "half"
    END = "end"
    MALFORMED = "malformed"


class Kind:
    """Values of OUTPUT_SCHEMA.kind: which sink a row goes to."""

    VISIBLE = "visible"
    CHECK = "check"
    DISCARD = "discard"
    DEAD_LETTER = "dead_letter"
    HISTORY = "history"

    ALL = (VISIBLE, CHECK, DISCARD, DEAD_LETTER, HISTORY)


# One row per Kafka record read from the half or end topic. Columns a kind does not use are null.
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "string"),  # EventKind
    ("transaction_id", "string"),  # the record key
    ("producer_group", "string"),
    ("decision", "string"),  # end: COMMIT_MESSAGE | ROLLBACK_MESSAGE | UNKNOW
    ("from_check", "boolean"),  # end: answers a back-check
    ("check_times", "int"),  # end: which check it answers
    ("operator", "string"),  # end: admin who resolved it by hand
    ("remark", "string"),  # end: e.g. the local transaction's exception
    ("topic", "string"),  # half: the real topic
    ("body", "binary"),  # half: the record value, untouched
    ("tags", "string"),
    ("keys", "string"),
    ("properties", "map<string,string>"),  # half: user properties
    ("msg_id", "string"),
    ("born_ms", "bigint"),
    ("immunity_s", "int"),
    ("error", "string"),  # malformed: why
    ("raw_key", "binary"),  # malformed: the record as read, to dead-letter it intact
    ("raw_value", "binary"),
    ("raw_headers", "array<struct<key:string,value:binary>>"),
    ("src_topic", "string"),
    ("src_partition", "int"),
    ("src_offset", "bigint"),
)
EVENT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in EVENT_COLUMNS)

# One row per record the coordinator writes.
OUTPUT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "string"),  # Kind
    ("topic", "string"),
    ("key", "binary"),
    ("value", "binary"),
    ("headers", "binary"),  # txstream.wire.pack_headers
    ("transaction_id", "string"),
    ("event", "string"),  # the kind
    # check: ms after its deadline it was asked; visible: ms from the commit's send to release
    ("lag_ms", "bigint"),
    # history: how many of each event its lines hold (the query's counters sum them); else null
    ("counts", "map<string,int>"),
    # The record's id (also its TXSTREAM_RECORD_ID header) and the micro-batch's time: both the
    # same when a batch is replayed after a crash, so the sink skips what was already written.
    ("record_id", "string"),
    ("batch_ms", "bigint"),
)
OUTPUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS)

# The state of one bucket: its transactions, encoded by state.bucket.Bucket.encode.
STATE_SCHEMA = "blob binary"
