"""txstream: sinks."""
