"""txstream: streaming."""
