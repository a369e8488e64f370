"""RocketMQ's transaction example on txstream (importable: `txstream demo` runs it)."""
