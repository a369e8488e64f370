"""The coordinator on Spark Structured Streaming: the engine (``txstream.streaming.engine``) and the
``txstream`` command line over it and the client library (``txstream.streaming.cli``)."""

if __name__ != "txstream.streaming":
    # The repository keeps the design's folders at its top; they are installed, and imported,
    # under txstream only (docs/decisions/0025-one-namespace.md).
    raise ImportError(f"import txstream.streaming, not {__name__}")

