"""The engine: the coordinator's streaming query and everything that runs it.

``config`` (RunConfig), ``session`` (the SparkSession), ``query`` (source -> stateful operator
-> sink), ``operator`` (the ``applyInPandasWithState`` adapter), ``key_step`` and ``records``
(one state key's call around the pure core in ``state/``, and the records it writes),
``checkpoint`` (what txstream keeps in the checkpoint), ``coordinator`` (the life cycle),
``progress`` and ``metrics`` (what it did), ``state_reader`` (its pending transactions, read
from the checkpoint), ``local_fs`` (checkpoint files without forks). Nothing here parses flags
or prints: that is ``txstream.streaming.cli``.
"""
