"""txstream: sources."""

if __name__ != "txstream.sources":
    # The repository keeps the design's folders at its top; they are installed, and imported,
    # under txstream only (docs/decisions/0025-one-namespace.md).
    raise ImportError(f"import txstream.sources, not {__name__}")

