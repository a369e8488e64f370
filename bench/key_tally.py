"""What the operator's per-key metrics cost (streaming.engine.key_metrics): CPU per transaction.

``python -m bench.key_tally [--transactions N] [--per-key K] [--open M]`` runs N transactions
(a half message, then its commit, in the next batch) through real buckets of K transactions per
key, each key also holding M pending ones, and prints per transaction: the core's work the
operator does anyway (decoding and encoding the key's state, ``Bucket.apply``, the records of
the effects), and the tally's
(``KeyTally.applied`` per event, ``KeyTally.summary`` once per key and batch). Pure Python, in
this process: no broker, no Spark; compare with the coordinator's whole CPU per transaction
(``txstream bench``'s ``cpu_us_per_tx``).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from txstream.message import Decision, EndEvent, Message
from txstream.state.bucket import Bucket
from txstream.state.policy import Policy
from txstream.streaming.engine.key_metrics import KeyTally
from txstream.streaming.engine.records import records_for
from txstream.topics import Topics

__all__ = ["measure"]

T0 = 1_700_000_000_000
POLICY = Policy()
TOPICS = Topics()


def _events(count: int) -> tuple[list[Message], list[EndEvent]]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    halves = [Message("orders", b"x" * 200, keys=f"k{i}", transaction_id=t, msg_id=t,
                      producer_group="G", born_timestamp=T0) for i, t in enumerate(ids)]
    ends = [EndEvent(t, "G", Decision.COMMIT_MESSAGE) for t in ids]
    return halves, ends


def _batch(blob: bytes, events: list[Message] | list[EndEvent], now: int,
           tally: KeyTally | None) -> tuple[bytes, float, float]:
    """One key's call: (its new state, seconds of core work, seconds of tally work)."""
    started = time.perf_counter()
    bucket = Bucket.decode(blob)
    core = time.perf_counter() - started
    tallied = 0.0
    for event in events:
        started = time.perf_counter()
        before = bucket.get(event.transaction_id) if isinstance(event, EndEvent) else None
        effects = bucket.apply(event, now, POLICY)
        list(records_for(effects, TOPICS))
        middle = time.perf_counter()
        if tally is not None:
            tally.applied(event, before, effects)
        core += middle - started
        tallied += time.perf_counter() - middle
    started = time.perf_counter()
    blob = bucket.encode()
    middle = time.perf_counter()
    if tally is not None:
        tally.summary(1, bucket)
    return blob, core + middle - started, tallied + time.perf_counter() - middle


def measure(transactions: int, per_key: int, held: int) -> dict[str, float]:
    core = tallied = 0.0
    for _ in range(max(1, transactions // per_key)):
        bucket = Bucket()
        for half in _events(held)[0]:  # pending ones the key keeps holding
            bucket.apply(half, T0, POLICY)
        blob = bucket.encode()
        halves, ends = _events(per_key)
        for events, now in ((halves, T0 + 10), (ends, T0 + 20)):
            blob, c, t = _batch(blob, events, now, KeyTally(now))
            core, tallied = core + c, tallied + t
    count = max(1, transactions // per_key) * per_key
    return {"transactions": count, "per_key": per_key, "held_per_key": held,
            "core_us_per_tx": round(core / count * 1e6, 2),
            "tally_us_per_tx": round(tallied / count * 1e6, 2),
            "tally_share_of_core": round(tallied / core, 4) if core else 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transactions", type=int, default=20_000)
    p.add_argument("--per-key", type=int, default=500, help="transactions per key and batch")
    p.add_argument("--open", type=int, default=0, help="pending transactions each key holds")
    args = p.parse_args()
    print(json.dumps(measure(args.transactions, args.per_key, args.open)))


if __name__ == "__main__":
    main()
