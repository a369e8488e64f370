"""txstream: sources."""
