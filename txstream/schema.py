"""The one schema module: the rows that flow through the coordinator's streaming query.

    Kafka (half + end topics)
      -> sources.kafka_source  rows of EVENT_SCHEMA: one per record, as read, with its state key
      -> streaming.operator    applyInPandasWithState keyed by ``state_key``, state STATE_SCHEMA;
                               decodes each record (sources.events) and runs the core
      -> rows of OUTPUT_SCHEMA (one per record to write, routed by ``kind``)
      -> sinks.kafka_sink      Kafka (real topics, check topics, discard, dead letter, history)

Rows are narrow on purpose: every column costs a conversion per row between the JVM, Arrow and
pandas, and a map or struct column a Python call per row on top (BENCHMARKS.md). Kept as DDL
strings so that importing this module needs no JVM.
"""

from __future__ import annotations

__all__ = [
    "EVENT_SCHEMA",
    "EVENT_COLUMNS",
    "HISTORY_COUNTED",
    "OUTPUT_SCHEMA",
    "OUTPUT_COLUMNS",
    "STATE_SCHEMA",
    "Kind",
    "EventKind",
]


class EventKind:
    """Values of EVENT_SCHEMA.kind: the topic a record was read from."""

    HALF = 0
    END = 1


class Kind:
    """Values of OUTPUT_SCHEMA.kind: which sink a row goes to."""

    VISIBLE = "visible"
    CHECK = "check"
    DISCARD = "discard"
    DEAD_LETTER = "dead_letter"
    HISTORY = "history"
    # Not a record: a state key's next timeout (``not_before_ms``; null: none), which the sink
    # folds into the timer schedule (txstream.timer_schedule) instead of writing it.
    TIMER = "timer"

    ALL = (VISIBLE, CHECK, DISCARD, DEAD_LETTER, HISTORY, TIMER)


# One row per Kafka record read from the half or end topic, undecoded: the operator decodes it
# (sources.events.parse_event), once.
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("state_key", "bigint"),  # state.keys.state_key of the record key (the transaction id)
    ("kind", "tinyint"),  # EventKind
    ("src_partition", "int"),
    ("src_offset", "bigint"),
    ("key", "binary"),
    ("value", "binary"),
    ("headers", "binary"),  # txstream.wire.pack_headers
    ("error", "string"),  # set when the Kafka client could not read the record at all
)
EVENT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in EVENT_COLUMNS)

HISTORY_COUNTED_PREFIX = "history_"
# One row per record the coordinator writes.
OUTPUT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "string"),  # Kind
    ("topic", "string"),
    ("key", "binary"),
    ("value", "binary"),
    ("headers", "binary"),  # txstream.wire.pack_headers
    # check: ms after its deadline it was asked; visible: ms from the commit's send to release
    ("lag_ms", "bigint"),
    # history: how many lines of each event it holds (the query's counters sum them); else null.
    # Plain columns, not a map: before each row Spark sizes the Arrow batch it sends the sink,
    # and sizing a map (list) vector walks it, quadratic in the rows (BENCHMARKS.md).
    *((f"{HISTORY_COUNTED_PREFIX}{event}", "int") for event in ("half", "rolled_back",
                                                                 "rejected", "duplicate",
                                                                 "expired")),
    # The record's id (also its TXSTREAM_RECORD_ID header) and the micro-batch's time: both the
    # same when a batch is replayed after a crash, so the sink skips what was already written.
    ("record_id", "string"),
    ("batch_ms", "bigint"),
    # A timer's record made ahead of its deadline (state.policy.Policy.timer_lead): the sink
    # sends it no earlier than this. Null: at once. A TIMER row: the key's next timeout.
    ("not_before_ms", "bigint"),
)
OUTPUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS)
# The history events counted in their own columns, by event name.
HISTORY_COUNTED = {name[len(HISTORY_COUNTED_PREFIX):]: name for name, _ in OUTPUT_COLUMNS
                   if name.startswith(HISTORY_COUNTED_PREFIX)}

# The state of one key: its transactions, encoded by state.bucket.Bucket.encode.
STATE_SCHEMA = "blob binary"
