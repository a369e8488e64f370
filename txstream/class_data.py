"""The JVM's application class-data sharing (AppCDS), one way for every JVM txstream starts.

A JVM started with ``-XX:ArchiveClassesAtExit`` writes the classes it loaded to an archive as
it exits; a later JVM with ``-XX:SharedArchiveFile`` maps them, already parsed and verified,
and starts seconds sooner. An archive only fits the class path and the JVM it was made with;
one that does not fit is passed over (``-Xshare:auto``), quietly: the JVM's warning about it
is logging switched off here. Used for Apache Kafka's nodes (txstream/kafka_node.py) and a
local coordinator's driver (txstream/streaming/engine/class_archive.py).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["sharing_options", "QUIET"]

# The JVM's class-data sharing says nothing: neither a refused archive at a start, nor the
# classes it skips (signed jars) as it writes one.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def sharing_options(archive: Path, write_to: Path | None = None) -> list[str]:
    """The JVM options that write an archive to ``write_to``, or else map ``archive`` if it
    is there (none if it is not)."""
    if write_to is not None:
        return [f"-XX:ArchiveClassesAtExit={write_to}", *QUIET]
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", *QUIET]
    return []
