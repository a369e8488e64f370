"""The project's own promises: documents held to the code, the import layers, packaging and the
compose file."""
