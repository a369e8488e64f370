"""A deterministic simulation of the whole coordinator loop: no Spark, no broker.

The coordinator's own code runs as it does in production, against an in-memory Kafka
(``txstream.kafka.memory``, behind the same client factories the I/O code uses): the
source's planner and reader, the operator (its per-key step, called per state key with a
``GroupState`` and the rows its pandas adapter would hand it: ``run(seed,
through_pandas=True)`` calls the adapter as Spark does, and a test keeps both ways alike),
the timer schedule, the sink's write path with its record ids and
replay check, the body read-back, the client's rule for which check request to answer, and
the consumer's dedup. What stands in for Spark is :mod:`txstream.testing.spark_model` (the
users' test kit runs on it too): its micro-batch contract (offset log, state versions,
processing-time timeouts, the event-time watermark, replay of an uncommitted batch), reduced
to what the coordinator relies on. Producers, their applications and consumers are
:mod:`sim.actors`; a seed decides everything (:mod:`sim.scenarios`), :mod:`sim.schedule`
plays it, and the promise is checked after every step (:mod:`sim.oracle`).

The broker answers as tansu does in half of the schedules, as Apache Kafka does in the other
half; in half of those the sink writes each task's records in one Kafka transaction
(``Scenario.transactional``, as ``--transactions auto`` does on a broker that isolates
them), and every actor and the oracle see what a ``read_committed`` consumer is handed. The
oracle then holds, at every committed batch, that the history says ``released`` only of what
a real topic holds (invariant 5): a note only with its release.

Run: ``pytest -m sim`` (``TXSTREAM_SIM_SEEDS=N`` schedules; ``TXSTREAM_SIM_SEED=S`` replays
one).
"""
