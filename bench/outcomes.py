"""What remembering resolved transactions costs: bytes and time per outcome (state.outcomes).

``python -m bench.outcomes [--transactions N] [--per-bucket K]`` resolves N transactions in
buckets of K, lets them leave the state, and prints, per remembered transaction: the bytes of
saved state and of Python heap, beside the same for a resolved transaction still held whole
(within ``resolved_retention``); and the time to save and load a bucket, and to look one up.
Pure core only: no broker, no Spark.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
import uuid

from txstream.message import Decision, EndEvent, Message
from txstream.state.bucket import Bucket
from txstream.state.policy import Policy

__all__ = ["measure"]

T0 = 1_700_000_000_000
POLICY = Policy(resolved_retention=1000)


def _resolved_bucket(count: int) -> tuple[Bucket, list[str]]:
    bucket, ids = Bucket(), [str(uuid.uuid4()) for _ in range(count)]
    for i, txid in enumerate(ids):
        half = Message("orders", b"x" * 200, keys=f"k{i}", transaction_id=txid, msg_id=txid,
                       producer_group="G", born_timestamp=T0)
        bucket.apply(half, T0, POLICY)
        bucket.apply(EndEvent(txid, "G", Decision.COMMIT_MESSAGE), T0 + 1, POLICY)
    return bucket, ids


def _heap_bytes(blobs: list[bytes]) -> int:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    buckets = [Bucket.decode(blob) for blob in blobs]
    for bucket in buckets:  # touch every entry, as a batch would
        bucket.next_wakeup(0, POLICY)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del buckets
    return used


def measure(transactions: int, per_bucket: int) -> dict[str, float]:
    held_blobs, kept_blobs, lookups = [], [], []
    for _ in range(max(1, transactions // per_bucket)):
        bucket, ids = _resolved_bucket(per_bucket)
        held_blobs.append(bucket.encode())
        bucket.fire_due(T0 + 1 + POLICY.resolved_retention, POLICY)  # they leave the state
        kept_blobs.append(bucket.encode())
        lookups.append((ids[0], ids[-1]))
    count = len(kept_blobs) * per_bucket
    started = time.perf_counter()
    decoded = [Bucket.decode(blob) for blob in kept_blobs]
    for bucket in decoded:
        bucket.encode()
    save_load = (time.perf_counter() - started) / len(decoded)
    started = time.perf_counter()
    found = sum(bucket.outcomes.recall(txid, T0 + 5000) is not None
                for bucket, pair in zip(decoded, lookups, strict=True) for txid in pair)
    recall = (time.perf_counter() - started) / (2 * len(decoded))
    assert found == 2 * len(decoded)
    return {
        "remembered": count,
        "per_bucket": per_bucket,
        "state_bytes_per_outcome": sum(map(len, kept_blobs)) / count,
        "state_bytes_per_resolved_held": sum(map(len, held_blobs)) / count,
        "heap_bytes_per_outcome": _heap_bytes(kept_blobs) / count,
        "heap_bytes_per_resolved_held": _heap_bytes(held_blobs) / count,
        "bucket_load_and_save_ms": save_load * 1000,
        "recall_us": recall * 1e6,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.outcomes", description=__doc__)
    p.add_argument("--transactions", type=int, default=1_000_000)
    p.add_argument("--per-bucket", type=int, default=10_000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = measure(args.transactions, args.per_bucket)
    if args.json:
        print(json.dumps(result))
        return
    for name, value in result.items():
        print(f"{name:32} {value:,.2f}" if isinstance(value, float) else f"{name:32} {value:,}")


if __name__ == "__main__":
    main()
