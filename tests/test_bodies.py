"""Bodies of held half messages, read back from the half topic by the sink (real tansu broker)."""

from __future__ import annotations

from typing import Any

import pytest

from sinks.bodies import ranges
from sinks.kafka_sink import SinkOptions, send_rows
from txstream.kafka import KafkaSettings, make_admin
from txstream.refusals import Code
from txstream.schema import Kind
from txstream.topics import Topics
from txstream.wire import H, pack_headers

from kafka_helpers import half_record, headers_of, output_row, produce, read_topic


@pytest.mark.parametrize(("offsets", "want"), [
    ([], []),
    ([5], [(5, 6)]),
    ([3, 1, 2, 2], [(1, 4)]),
    ([0, 511, 1100, 2000, 2001], [(0, 512), (1100, 1101), (2000, 2002)]),
])
def test_close_offsets_are_read_in_one_range(offsets: list[int],
                                             want: list[tuple[int, int]]) -> None:
    assert ranges(offsets, gap=512) == want


def _half_topic(kafka: KafkaSettings, topics: Topics) -> dict[str, int]:
    """Three half messages with 700 others between the first and the second: their offsets."""
    from kafka.admin import NewTopic

    admin = make_admin(kafka)
    try:
        admin.create_topics([NewTopic(topics.half, 1, -1)])
    finally:
        admin.close()
    names = ["tx-a", *(f"other-{i}" for i in range(700)), "tx-b", "tx-c"]
    produce(kafka, [half_record(topics, txid, "G", "orders", body=f"body of {txid}".encode())
                    for txid in names])
    return {txid: offset for offset, txid in enumerate(names)}


def _rows(topics: Topics, at: dict[str, int], real: str) -> list[Any]:
    def release(txid: str, offset: int) -> Any:
        headers = pack_headers([(H.TRAN_MSG, b"true"), (H.TRANSACTION_ID, txid.encode())])
        return output_row(Kind.VISIBLE, real, b"K", None, headers, body_at=(0, offset))

    def check(txid: str, offset: int) -> Any:
        return output_row(Kind.CHECK, topics.check("G"), txid.encode(), None,
                          pack_headers([(H.CHECK_TIMES, b"1")]), body_at=(0, offset))

    return [
        release("tx-a", at["tx-a"]),
        check("tx-a", at["tx-a"]),  # the same record, for two rows
        check("tx-b", at["tx-b"]),
        output_row(Kind.DISCARD, topics.discard, b"tx-c", None, None, body_at=(0, at["tx-c"])),
        output_row(Kind.HISTORY, topics.history, b"1", b"[]"),  # carries its own value
        release("tx-x", at["other-5"]),  # another transaction's record lies there
        check("tx-y", 10_000),  # past the partition's end: gone
    ]


def test_the_sink_reads_each_body_back_and_dead_letters_what_is_gone(
        kafka: KafkaSettings, unique: str) -> None:
    topics = Topics.with_prefix(f"{unique}_")
    at = _half_topic(kafka, topics)
    options = SinkOptions(kafka=kafka, dead_letter_topic=topics.dead_letter,
                          half_topic=topics.half)
    commit = send_rows(options, _rows(topics, at, f"{unique}_real"))
    assert commit.counts == {Kind.VISIBLE: 1, Kind.CHECK: 2, Kind.DISCARD: 1, Kind.HISTORY: 1,
                             Kind.DEAD_LETTER: 2}

    assert [r.value for r in read_topic(kafka, f"{unique}_real")] == [b"body of tx-a"]
    checks = {r.key: r.value for r in read_topic(kafka, topics.check("G"))}
    assert checks == {b"tx-a": b"body of tx-a", b"tx-b": b"body of tx-b"}
    assert [r.value for r in read_topic(kafka, topics.discard)] == [b"body of tx-c"]

    letters = [(r.value, headers_of(r)) for r in read_topic(kafka, topics.dead_letter)]
    assert [value for value, _ in letters] == [None, None]
    assert {h[H.DLQ_CODE] for _, h in letters} == {Code.HALF_MESSAGE_LOST}
    assert [(h[H.DLQ_ORIGIN_TOPIC], h[H.DLQ_ORIGIN_OFFSET]) for _, h in letters] == [
        (topics.half, str(at["other-5"])), (topics.half, "10000")]
    reasons = [h[H.DLQ_REASON] for _, h in letters]
    assert "another transaction's record" in reasons[0]
    assert "no longer in the topic" in reasons[1]
    # Everything but the body is kept: whose it was, and what it was.
    assert letters[0][1][H.TRANSACTION_ID] == "tx-x"


def test_rows_that_need_bodies_need_the_half_topic(kafka: KafkaSettings, unique: str) -> None:
    from txstream.errors import SendFailed

    topics = Topics.with_prefix(f"{unique}_")
    row = output_row(Kind.CHECK, topics.check("G"), b"t", None, None, body_at=(0, 0))
    with pytest.raises(SendFailed, match="half_topic"):
        send_rows(SinkOptions(kafka=kafka, dead_letter_topic=topics.dead_letter), [row])
