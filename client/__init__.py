"""txstream: client."""
