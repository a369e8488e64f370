"""txstream: state."""
