"""A test kit for applications of txstream: their transaction listeners and consumers against
the coordinator's real code, in memory, on a virtual clock (:class:`TransactionTestDriver`).

It needs the coordinator's packages (pyspark, pandas, pyarrow: ``pip install
'txstream[coordinator]'``), not a JVM, a broker or Spark running. The deterministic simulation
of the project's own tests runs on the same pieces: :class:`~txstream.testing.spark_model.
SparkModel` (Spark's micro-batch contract) and the in-memory Kafka (:mod:`txstream.kafka.memory`).
"""

import importlib.util


def _missing(names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


# A producer application's install has none of them: say what to install, in one line.
if _absent := _missing(("pyspark", "pandas", "pyarrow")):
    raise ImportError(f"txstream.testing runs the coordinator's code and needs "
                      f"{', '.join(_absent)}: pip install 'txstream[coordinator]'")

from txstream.testing.driver import Discarded, ProducerKilled, TransactionTestDriver  # noqa: E402

__all__ = ["TransactionTestDriver", "Discarded", "ProducerKilled"]
