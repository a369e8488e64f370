"""The engine: the coordinator's streaming query and everything that runs it.

``config`` (RunConfig), ``session`` (the SparkSession), ``query`` (source -> stateful operator
-> sink), ``operator`` and ``records`` (the ``applyInPandasWithState`` adapter around the pure
core in ``state/``), ``checkpoint`` (what txstream keeps in the checkpoint), ``coordinator``
(the life cycle), ``progress`` and ``metrics`` (what it did), ``state_reader`` (its pending
transactions, read from the checkpoint), ``local_fs`` (checkpoint files without forks).
Nothing here parses flags or prints: that is ``txstream.streaming.cli``.
"""
