"""``txstream bench``: how fast, how late and how big the coordinator is, against the limit.

:mod:`bench.runner` runs the phases; :mod:`bench.workload` builds wire-format records and does
the bulk I/O; :mod:`bench.raw_pipe` is the Spark-free limit; :mod:`bench.harness` starts a
coordinator and logs its micro-batches (:mod:`bench.batches`); :mod:`bench.coordinator_phases`
measures throughput, commit -> visible latency and back-check lateness;
:mod:`bench.pending_scale` the micro-batch time and memory against the number of pending
transactions (:mod:`bench.procmem` reads RSS and CPU time from /proc); :mod:`bench.report`
prints; :mod:`bench.profile_workers` samples a running coordinator with py-spy;
:mod:`bench.broker_tail` measures how the test broker's tail fetches grow with the log;
:mod:`bench.micro_operator` times the coordinator operator's parts in µs per call, in process.
``bench/source_sink_probe.py`` is the source/sink owner's own probe.
"""

__all__: list[str] = []
