"""A deterministic simulation of the whole coordinator loop: no Spark, no broker.

The coordinator's own code runs as it does in production, against an in-memory Kafka
(``txstream.kafka.memory``, behind the same client factories the I/O code uses): the source's
planner and reader, the operator (``coordinator_function``, called per state key with a
``GroupState``), the timer schedule, the sink's write path with its record ids and replay
check, the body read-back, the client's rule for which check request to answer, and the
consumer's dedup. What stands in for Spark is :mod:`sim.spark`: its micro-batch contract
(offset log, state versions, processing-time timeouts, the event-time watermark, replay of an
uncommitted batch), reduced to what the coordinator relies on. Producers, their applications
and consumers are :mod:`sim.actors`; a seed decides everything (:mod:`sim.schedule`), and the
promise is checked after every step (:mod:`sim.oracle`).

Run: ``pytest -m sim`` (``TXSTREAM_SIM_SEEDS=N`` schedules; ``TXSTREAM_SIM_SEED=S`` replays one).
"""
