"""txstream: sinks."""

if __name__ != "txstream.sinks":
    # The repository keeps the design's folders at its top; they are installed, and imported,
    # under txstream only (docs/decisions/0025-one-namespace.md).
    raise ImportError(f"import txstream.sinks, not {__name__}")

