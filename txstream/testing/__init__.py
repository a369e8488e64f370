"""A test kit for applications of txstream: their transaction listeners and consumers against
the coordinator's real code, in memory, on a virtual clock (:class:`TransactionTestDriver`).

It needs the coordinator's packages (pyspark, pandas, pyarrow: ``pip install
'txstream[coordinator]'``), not a JVM, a broker or Spark running. The deterministic simulation
of the project's own tests runs on the same pieces: :class:`~txstream.testing.spark_model.
SparkModel` (Spark's micro-batch contract) and the in-memory Kafka (:mod:`txstream.kafka.memory`).
"""

from txstream.extras import require_coordinator

# A producer application's install has none of them: say what to install, in one line.
require_coordinator("txstream.testing", ("pyspark", "pandas", "pyarrow"))

from txstream.testing.driver import Discarded, ProducerKilled, TransactionTestDriver  # noqa: E402

__all__ = ["TransactionTestDriver", "Discarded", "ProducerKilled"]
