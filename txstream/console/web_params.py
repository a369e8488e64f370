"""The console's request parameters, checked: a bad one is answered 400 with a sentence that
says what is accepted (as JSON under ``/api/``, as a page elsewhere), never guessed at."""

from __future__ import annotations

from collections.abc import Mapping

from flask import abort

from txstream.console.queries import REFUSED_SOURCES, SORTS, TxQuery
from txstream.console.transaction_rows import IndexStatus

__all__ = ["MAX_LIMIT", "int_param", "statuses", "tx_query", "refused_sources"]

MAX_LIMIT = 1000  # rows in one answer (the index's own cap)
_ORDERS = ("desc", "asc")


def int_param(args: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """``name`` as a whole number from ``low`` to ``high``; ``default`` when it is absent."""
    text = (args.get(name) or "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        abort(400, f"{name} must be a whole number from {low} to {high}, not {text!r}")
    return value


def statuses(text: str | None) -> tuple[str, ...]:
    """``open`` (PENDING and EARLY_END), ``all`` or empty (every status), or a
    comma-separated list of statuses."""
    text = (text or "").strip()
    if text.lower() == "open":
        return IndexStatus.OPEN
    if not text or text.lower() == "all":
        return ()
    wanted = tuple(s.strip().upper() for s in text.split(",") if s.strip())
    unknown = [s for s in wanted if s not in IndexStatus.ALL]
    if unknown:
        abort(400, f"status must be open, all or a comma-separated list of "
                   f"{', '.join(IndexStatus.ALL)}; unknown: {', '.join(unknown)}")
    return wanted


def _choice(args: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = (args.get(name) or "").strip() or default
    if value not in choices:
        abort(400, f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def tx_query(args: Mapping[str, str], default_status: str) -> TxQuery:
    """The transactions a page or ``/api/transactions`` asks for."""
    return TxQuery(
        statuses=statuses(args.get("status", default_status)),
        group=(args.get("group") or "").strip() or None,
        text=(args.get("q") or "").strip() or None,
        sort=_choice(args, "sort", "age", tuple(SORTS)),
        descending=_choice(args, "order", "desc", _ORDERS) == "desc",
        limit=int_param(args, "limit", 200, 1, MAX_LIMIT),
        offset=int_param(args, "offset", 0, 0, 2**62))


def refused_sources(args: Mapping[str, str]) -> tuple[str, ...]:
    """``source``: ``discard``, ``dead_letter``, or both when absent."""
    source = (args.get("source") or "").strip()
    if not source:
        return REFUSED_SOURCES
    return (_choice(args, "source", "", REFUSED_SOURCES),)
