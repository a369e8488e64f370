"""State keys: a transaction id's creation-time window and shard, placed on Spark's partitions."""

from __future__ import annotations

import random
import time
import uuid
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txstream.client.options import new_message_id
from txstream.state.keys import (
    UNROUTABLE,
    KeyLayout,
    id_time_ms,
    key_window,
    spark_partition,
    state_key,
)

LAYOUT = KeyLayout()


def v7(ms: int, rand: int = 0x123456789ABCDEF0123) -> str:
    value = ms << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64 | 0b10 << 62 | rand & (2**62 - 1)
    return f"{value:032X}"


def test_the_client_makes_uuid7_ids_that_carry_their_creation_time() -> None:
    before = int(time.time() * 1000)
    txid = new_message_id()
    after = int(time.time() * 1000)
    parsed = uuid.UUID(txid)
    assert len(txid) == 32 and txid == txid.upper()
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    born = id_time_ms(txid)
    assert born is not None and before <= born <= after
    assert len({new_message_id() for _ in range(1000)}) == 1000


@pytest.mark.parametrize("form", [str.upper, str.lower,
                                  lambda h: str(uuid.UUID(h)), lambda h: str(uuid.UUID(h)).upper()])
def test_id_time_reads_every_spelling_of_a_uuid7(form) -> None:
    assert id_time_ms(form(v7(1_795_000_000_123))) == 1_795_000_000_123


@pytest.mark.parametrize("txid", [
    "9c0fab4b637a4cad98936c5775a5d7e4", "1444ccb7-4a91-4042-b8bf-984cc2bd18e5",  # version 4
    "tx-1", "", "order-42", "G" * 32,
    v7(5).replace("7", "4", 1)[:12] + "4" + v7(5)[13:],  # version 4 bits
    v7(5)[:16] + "0" + v7(5)[17:],  # not the RFC 9562 variant
    v7(5)[:8] + "_" + v7(5)[9:],  # not hex
    str(uuid.UUID(v7(5))).replace("-", "+"),
])
def test_ids_without_a_time_have_none(txid: str) -> None:
    assert id_time_ms(txid) is None


def test_a_window_of_ids_shares_its_keys_and_the_next_window_has_new_ones() -> None:
    start = 1_795_000_000_000
    first = {state_key(v7(start + ms, random.getrandbits(74)), LAYOUT) for ms in range(0, 1000, 7)}
    second = {state_key(v7(start + 1000 + ms, random.getrandbits(74)), LAYOUT)
              for ms in range(0, 1000, 7)}
    assert len(first) == len(second) == LAYOUT.shards
    assert not first & second
    assert {key_window(k, LAYOUT) for k in first} == {(start, start + 1000)}


def test_each_shard_of_a_window_goes_to_its_own_spark_partition() -> None:
    for layout in (LAYOUT, KeyLayout(shards=4, partitions=4), KeyLayout(shards=6, partitions=3)):
        for window in range(50):
            keys = {state_key(v7(1_795_000_000_000 + window * layout.window_ms,
                                  random.getrandbits(74)), layout) for _ in range(200)}
            placed = sorted(spark_partition(k, layout.partitions) for k in keys)
            assert len(keys) == layout.shards
            assert placed == sorted(s % layout.partitions for s in range(layout.shards))


@given(st.text(min_size=1, max_size=80))
def test_any_id_has_one_stable_key(txid: str) -> None:
    key = state_key(txid, LAYOUT)
    assert key == state_key(txid, LAYOUT) != UNROUTABLE
    if id_time_ms(txid) is None:
        assert key < 0 and key_window(key, LAYOUT) is None
        bucket = zlib.crc32(txid.encode("utf-8")) % LAYOUT.fallback_buckets
        assert spark_partition(key, LAYOUT.partitions) == bucket % LAYOUT.partitions
    else:
        assert key >= 0


def test_fallback_buckets_are_bounded_and_spread_over_partitions() -> None:
    keys = {state_key(f"order-{i}", LAYOUT) for i in range(5000)}
    assert len(keys) == LAYOUT.fallback_buckets
    per_partition = [sum(spark_partition(k, 2) == p for k in keys) for p in (0, 1)]
    assert per_partition == [LAYOUT.fallback_buckets // 2] * 2


def test_another_layout_is_another_routing() -> None:
    txid = v7(1_795_000_000_500)
    assert state_key(txid, LAYOUT) != state_key(txid, KeyLayout(window_ms=2000))


@pytest.mark.parametrize("bad", [dict(window_ms=0), dict(shards=0), dict(partitions=0),
                                 dict(fallback_buckets=0)])
def test_a_layout_needs_positive_sizes(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        KeyLayout(**bad)


@pytest.mark.spark
def test_spark_sends_each_key_to_the_partition_we_computed(spark) -> None:
    from pyspark.sql import functions as F

    keys = [random.randint(-2**63, 2**63 - 1) for _ in range(500)]
    keys += [state_key(new_message_id(), LAYOUT) for _ in range(200)] + [0, -1, 2**63 - 1]
    for n in (2, 3, 8):
        rows = (spark.createDataFrame([(k,) for k in keys], "k bigint")
                .select("k", F.pmod(F.hash("k"), F.lit(n)).alias("p")).collect())
        assert [(r.k, r.p) for r in rows] == [(k, spark_partition(k, n)) for k in keys]
