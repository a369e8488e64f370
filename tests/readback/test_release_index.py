"""The look of a new checkpoint for its predecessor's releases (0029) reads each real-topic
partition once for every state key that asks, and past other writers' records whatever their
timestamps say (in-memory broker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import txstream.readback.release_index as release_index
from tests.support.memory_helpers import Clock, new_broker
from txstream.kafka.memory import MemoryBroker
from txstream.readback.release_index import forget_release_indexes, released_by_others
from txstream.wire import H

TAG = "0badc0de"
DAY = 86_400_000


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    clock = Clock(1_700_000_000_000)
    with new_broker(clock) as made:
        made.create_topic("orders", 2)
        yield made
    forget_release_indexes()


def _release(broker: MemoryBroker, txid: str, rid: str, partition: int = 0,
             at: int | None = None) -> None:
    broker.append("orders", None, b"m", [(H.TRANSACTION_ID, txid.encode()),
                                         (H.RECORD_ID, rid.encode())],
                  partition=partition, timestamp=at)


def _foreign(broker: MemoryBroker, count: int, at: int, partition: int = 0) -> None:
    for i in range(count):
        broker.append("orders", f"f{i}".encode(), b"not ours", partition=partition,
                      timestamp=at)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records read by the index, per call of either reader."""
    read: list[int] = []
    for name in ("read_range", "read_back"):
        real = getattr(release_index, name)

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Iterator[Any]:
            for item in _real(*args, **kwargs):
                read.append(len(item) if isinstance(item, list) else 1)
                yield item

        monkeypatch.setattr(release_index, name, counted)
    return read


def test_every_key_asks_and_each_partition_is_read_once(
        broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    now = broker.clock()
    old = now - DAY
    for i in range(300):  # the predecessor's releases, of many state keys
        _release(broker, f"tx-{i}", f"{TAG}.{i % 30}.{old}.{i}", partition=i % 2,
                 at=old + i)
    read = _counting(monkeypatch)
    found: set[str] = set()
    for key in range(30):  # each key of the new checkpoint asks for its own transactions
        ours = f"{TAG}.{key}.{now}."
        wanted = {"orders": {f"tx-{i}": old - 1000 for i in range(key, 300, 30)}}
        found |= released_by_others(broker.settings, wanted, TAG, ours)
    assert found == {f"tx-{i}" for i in range(300)}
    assert sum(read) == 300  # once: the first look reads it all, the others read nothing


def test_a_key_does_not_find_what_it_released_itself_and_new_records_are_read_as_they_come(
        broker: MemoryBroker) -> None:
    now = broker.clock()
    ours = f"{TAG}.3.{now}."
    _release(broker, "tx-ours", f"{ours}0", at=now)
    assert released_by_others(broker.settings, {"orders": {"tx-ours": now - DAY}}, TAG,
                              ours) == set()
    # Written after the index was made: read forwards at the next look.
    _release(broker, "tx-later", f"{TAG}.3.{now - DAY}.5", at=now - DAY)
    assert released_by_others(broker.settings, {"orders": {"tx-later": now - 2 * DAY}}, TAG,
                              ours) == {"tx-later"}
    # Another coordinator's record (another tag) is no release of ours.
    _release(broker, "tx-theirs", f"feedf00d.3.{now - DAY}.1", at=now - DAY)
    assert released_by_others(broker.settings, {"orders": {"tx-theirs": now - 2 * DAY}}, TAG,
                              ours) == set()


@pytest.mark.parametrize("stamp", [-DAY, -600_001, DAY], ids=["a-day-old", "ten-minutes-old",
                                                             "a-day-ahead"])
def test_other_writers_timestamps_do_not_end_the_search(
        broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch, stamp: int) -> None:
    """A foreign record older than a horizon does not end the read back: if it did, a
    release behind a few chunks of them would not be found (and a replay would write it
    again)."""
    monkeypatch.setattr("txstream.kafka.read_back.READ_BACK_CHUNK", 8)
    now = broker.clock()
    _release(broker, "tx-1", f"{TAG}.1.{now - 1000}.0", at=now - 1000)
    _foreign(broker, 50, now + stamp)
    assert released_by_others(broker.settings, {"orders": {"tx-1": now - 2000}}, TAG,
                              f"{TAG}.1.{now}.") == {"tx-1"}
