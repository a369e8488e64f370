"""Bodies of held half messages, read back from the half topic (real tansu broker)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.kafka_helpers import half_record, output_row, produce, read_topic, wait_until
from txstream.kafka import KafkaSettings, close_quietly, make_admin, make_consumer, make_producer
from txstream.readback.bodies import OTHER_RECORD, BodySource, gone_bodies, ranges
from txstream.schema import Kind
from txstream.sinks.kafka_sink import SinkOptions, send_rows
from txstream.topics import Topics
from txstream.wire import H, pack_headers


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


def test_the_sink_reads_each_body_back_once(kafka: KafkaSettings, unique: str) -> None:
    topics = Topics.with_prefix(f"{unique}_")
    at = _half_topic(kafka, topics)
    options = SinkOptions(kafka=kafka, dead_letter_topic=topics.dead_letter,
                          half_topic=topics.half)
    rows = _rows(topics, at, f"{unique}_real")
    commit = send_rows(options, rows[:5])
    assert commit.counts == {Kind.VISIBLE: 1, Kind.CHECK: 2, Kind.DISCARD: 1, Kind.HISTORY: 1}
    assert [r.value for r in read_topic(kafka, f"{unique}_real")] == [b"body of tx-a"]
    checks = {r.key: r.value for r in read_topic(kafka, topics.check("G"))}
    assert checks == {b"tx-a": b"body of tx-a", b"tx-b": b"body of tx-b"}
    assert [r.value for r in read_topic(kafka, topics.discard)] == [b"body of tx-c"]


@pytest.mark.parametrize(("row", "why"), [(5, "another transaction's record"),
                                          (6, "lies past the end of its partition")])
def test_a_body_gone_since_the_operator_read_it_fails_the_batch_and_writes_nothing(
        kafka: KafkaSettings, unique: str, row: int, why: str) -> None:
    """The operator found it and decided; the replay decides again with what is there (the
    history never says "released" for what was not)."""
    from txstream.errors import SendFailed

    topics = Topics.with_prefix(f"{unique}_")
    at = _half_topic(kafka, topics)
    options = SinkOptions(kafka=kafka, dead_letter_topic=topics.dead_letter,
                          half_topic=topics.half)
    rows = _rows(topics, at, f"{unique}_real")
    with pytest.raises(SendFailed, match=f"{why}.* since it was read in this batch"):
        send_rows(options, [*rows[:2], rows[row]])
    assert read_topic(kafka, f"{unique}_real") == []
    assert read_topic(kafka, topics.dead_letter) == []


def test_rows_that_need_bodies_need_the_half_topic(kafka: KafkaSettings, unique: str) -> None:
    from txstream.errors import SendFailed

    topics = Topics.with_prefix(f"{unique}_")
    row = output_row(Kind.CHECK, topics.check("G"), b"t", None, None, body_at=(0, 0))
    with pytest.raises(SendFailed, match="half_topic"):
        send_rows(SinkOptions(kafka=kafka, dead_letter_topic=topics.dead_letter), [row])


def test_what_is_gone_says_why(kafka: KafkaSettings, unique: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A body past its partition's end is waited for ``SHORT_SETTLE_S`` (a new leader's high
    watermark catching up), then gone."""
    from txstream.errors import SendFailed
    from txstream.readback import bodies

    clock = [1000.0]
    monkeypatch.setattr(bodies, "settle_clock", lambda: clock[0])
    topics = Topics.with_prefix(f"{unique}_")
    at = _half_topic(kafka, topics)
    wanted = {"tx-a": (0, at["tx-a"]), "tx-b": (0, at["tx-b"]), "tx-c": (0, at["tx-c"]),
              "tx-x": (0, at["other-5"]),  # another transaction's record lies there
              "tx-y": (0, 10_000)}  # past the partition's end
    with pytest.raises(SendFailed, match="short of offset 10000, a half message read before: "
                                         "waiting up to 5 s"):
        gone_bodies(BodySource(kafka, topics.half), wanted)
    clock[0] += bodies.SHORT_SETTLE_S
    gone = gone_bodies(BodySource(kafka, topics.half), wanted)
    assert gone == {"tx-x": OTHER_RECORD,
                    "tx-y": f"lies past the end of its partition ({max(at.values()) + 1}), which "
                            "held it before: the half topic was created again, or the broker "
                            "lost records (an unclean leader election)"}


# --- a kept consumer's stale end, and a half topic recreated with fewer partitions -----------


class _Consumer:
    """A real consumer whose next poll after a seek, once ``hold`` is set, comes back empty
    without asking the broker: its fetch has not come back yet (the race, made certain)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.hold = False
        self._sought = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def seek(self, tp: Any, offset: int) -> None:
        self.real.seek(tp, offset)
        self._sought = True

    def poll(self, **kwargs: Any) -> Any:
        if self.hold and self._sought:
            self.hold = self._sought = False
            return {}
        self._sought = False
        return self.real.poll(**kwargs)


@pytest.fixture
def consumers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_Consumer]]:
    """Every consumer the body source makes, in order (the first is the kept one): its
    readers are the Kafka module's patient consumers."""
    import txstream.kafka.patience as patience_module
    made: list[_Consumer] = []

    def make(settings: KafkaSettings, **kwargs: Any) -> _Consumer:
        made.append(_Consumer(make_consumer(settings, **kwargs)))
        return made[-1]

    monkeypatch.setattr(patience_module, "make_consumer", make)
    yield made
    for consumer in made:
        close_quietly(consumer.real)


def _own(kafka: KafkaSettings, unique: str) -> KafkaSettings:
    """Settings of the test's own: a body source with them keeps a consumer of its own."""
    return KafkaSettings(bootstrap_servers=kafka.bootstrap_servers,
                         properties={"client.id": unique})


def _create(kafka: KafkaSettings, topic: str, partitions: int) -> None:
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = make_admin(kafka)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.create_topics([NewTopic(topic, partitions, -1)])
                return
            except TopicAlreadyExistsError:  # a deletion the broker has not finished
                if _partition_count(kafka, topic) == partitions:
                    return  # created again by a kept client's metadata request (tansu)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        admin.close()


def _partition_count(kafka: KafkaSettings, topic: str) -> int:
    consumer = make_consumer(kafka)
    try:
        consumer.topics()
        return len(consumer.partitions_for_topic(topic) or ())
    finally:
        consumer.close()


def _write(kafka: KafkaSettings, topics: Topics, partition: int, txids: list[str]) -> None:
    """Half messages of ``txids``, in order, to one partition of the half topic."""
    producer = make_producer(kafka)
    try:
        for txid in txids:
            rec = half_record(topics, txid, "G", "orders", body=f"body of {txid}".encode())
            producer.send(rec.topic, key=rec.key, value=rec.value, headers=list(rec.headers),
                          partition=partition)
        producer.flush()
    finally:
        producer.close()


def _read(source: BodySource, wanted: dict[str, tuple[int, int]]) -> list[Any]:
    """(transaction id, body or None, why gone) per wanted body, in order."""
    positions: dict[int, set[int]] = {}
    for partition, offset in wanted.values():
        positions.setdefault(partition, set()).add(offset)
    found = source.read(positions)
    return [(txid, found[at].value if at in found else None,
             "" if at in found else source.why_missing(*at)) for txid, at in wanted.items()]


def test_a_kept_consumer_whose_fetch_has_not_come_back_reads_the_body_it_had_no_end_for(
        kafka: KafkaSettings, unique: str, consumers: list[_Consumer]) -> None:
    """The kept consumer read the partition when its end was 150; the body is at 200 and the
    first poll after the seek comes back empty: the end it knew is no answer."""
    topics = Topics.with_prefix(f"{unique}_")
    _create(kafka, topics.half, 1)
    _write(kafka, topics, 0, [f"tx-{i}" for i in range(150)])
    settings = _own(kafka, unique)
    assert _read(BodySource(settings, topics.half), {"tx-149": (0, 149)}) \
        == [("tx-149", b"body of tx-149", "")]
    _write(kafka, topics, 0, [f"tx-{i}" for i in range(150, 201)])

    kept = consumers[0]
    kept.hold = True
    assert _read(BodySource(settings, topics.half), {"tx-200": (0, 200)}) \
        == [("tx-200", b"body of tx-200", "")]
    assert not kept.hold, "the empty poll happened"
    assert len(consumers) == 1, "the kept consumer read it, with no consumer made for it"


def test_a_fetch_the_kept_consumer_sent_ahead_is_no_verdict_on_what_came_after_it(
        kafka: KafkaSettings, unique: str, consumers: list[_Consumer]) -> None:
    """The kept consumer holds a fetch it sent at 150, answered when the partition ended at
    160 (what a read that stops at the end leaves while records arrive): a body written after
    it, at 180, is read all the same."""
    from kafka import TopicPartition

    topics = Topics.with_prefix(f"{unique}_")
    _create(kafka, topics.half, 1)
    _write(kafka, topics, 0, [f"tx-{i}" for i in range(150)])
    settings = _own(kafka, unique)
    BodySource(settings, topics.half).read({0: {149}})
    _write(kafka, topics, 0, [f"tx-{i}" for i in range(150, 160)])

    # A fetch at 150 sent and not yet returned; then, in kafka-python's buffer, its answer.
    kept, tp = consumers[0].real, TopicPartition(topics.half, 0)
    kept.assign([tp])
    kept.seek(tp, 150)
    while kept.poll(timeout_ms=0):  # the fetch came back within the poll: send another
        kept.seek(tp, 150)
    wait_until(lambda: [(f.fetched_offset, f.partition_data.high_watermark)
                        for f in kept._fetcher._completed_fetches] == [(150, 160)], 5.0)
    _write(kafka, topics, 0, [f"tx-{i}" for i in range(160, 200)])

    assert _read(BodySource(settings, topics.half), {"tx-150": (0, 150), "tx-180": (0, 180)}) \
        == [("tx-150", b"body of tx-150", ""), ("tx-180", b"body of tx-180", "")]


@pytest.mark.parametrize("read_before", [True, False], ids=["kept-consumer-knew-it", "new"])
def test_bodies_in_a_partition_the_recreated_half_topic_lacks_are_gone_at_once(
        kafka: KafkaSettings, unique: str, read_before: bool) -> None:
    """The half topic recreated with 1 partition instead of 3: bodies in partition 2 are gone,
    at once, and the reason says so; a body in the new topic is read."""
    topics = Topics.with_prefix(f"{unique}_")
    _create(kafka, topics.half, 3)
    _write(kafka, topics, 2, ["tx-b", "tx-c"])
    settings = _own(kafka, unique)
    if read_before:  # the process's kept consumer knows partition 2
        assert set(BodySource(settings, topics.half).read({2: {0, 1}})) == {(2, 0), (2, 1)}
    admin = make_admin(kafka)
    try:
        admin.delete_topics([topics.half])
    finally:
        admin.close()
    _create(kafka, topics.half, 1)
    _write(kafka, topics, 0, ["tx-new"])

    started = time.monotonic()
    read = _read(BodySource(settings, topics.half),
                 {"tx-new": (0, 0), "tx-b": (2, 0), "tx-c": (2, 1)})
    took = time.monotonic() - started
    assert read[0] == ("tx-new", b"body of tx-new", "")
    assert [(txid, body) for txid, body, _ in read[1:]] == [("tx-b", None), ("tx-c", None)]
    for _, _, reason in read[1:]:
        assert "partition 2 no longer exists" in reason
    assert took < 10, f"took {took:.1f} s: a read waited for a partition that is not there"


def test_an_unreachable_broker_fails_the_read_and_reports_nothing_gone(
        unique: str, own_broker: Callable[..., Any]) -> None:
    """The batch runs again later: no body may be called gone because the broker is down."""
    from txstream.errors import SendFailed

    topics = Topics.with_prefix(f"{unique}_")
    with own_broker() as broker:
        # Clients give up connecting after 2 s (not 30), so that the failure comes soon.
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers,
                              extra={"bootstrap_timeout_ms": 2000})
        _create(kafka, topics.half, 1)
        _write(kafka, topics, 0, ["tx-a"])
        source = BodySource(kafka, topics.half)
        assert set(source.read({0: {0}})) == {(0, 0)}
    with pytest.raises(SendFailed, match="cannot read half messages back"):
        source.read({0: {0, 5}})
