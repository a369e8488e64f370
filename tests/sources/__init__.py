"""The txstream-events source (txstream/sources): planning, reading, rows, progress and
recovery."""
