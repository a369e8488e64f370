"""The coordinator on Spark Structured Streaming: the engine (``streaming.engine``) and the
``txstream`` command line over it and the client library (``streaming.cli``)."""
