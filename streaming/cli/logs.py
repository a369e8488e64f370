"""txstream's own lines: the commands' progress lines and Python's logging, stamped with an ISO
8601 time with the date and offset, as text or as one JSON object per line (``--log-format``).

Spark's own lines keep its log4j layout (``streaming/engine/resources``); ``--log-level`` sets
both.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import datetime

__all__ = ["LOG_FORMATS", "configure_logging", "say", "iso_time"]

LOG_FORMATS = ("text", "json")
_SAY = logging.getLogger("txstream.say")  # the progress lines, printed whatever the level
_format = "text"
_LOCK = threading.Lock()


def iso_time(seconds: float) -> str:
    """``2026-11-25T12:15:51.123+00:00``: local time with its offset, to the millisecond."""
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="milliseconds")


class JsonLines(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": iso_time(record.created), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class IsoText(logging.Formatter):
    """``TIME LEVEL logger: message``, the time as :func:`iso_time`."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_time(record.created)


def configure_logging(fmt: str = "text") -> None:
    """Python's logging to stderr in ``fmt`` (``text`` or ``json``); the progress lines of
    :func:`say` follow it."""
    global _format
    _format = fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else
                         IsoText("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)


def say(text: str) -> None:
    """A command's progress line on stdout, stamped: shown at every log level."""
    record = _SAY.makeRecord(_SAY.name, logging.INFO, "", 0, text, None, None)
    line = (JsonLines().format(record) if _format == "json"
            else f"[{iso_time(record.created)}] {text}")
    with _LOCK:  # one write per line: lines said from two threads never run into one
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
