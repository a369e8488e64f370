"""The console's pages and JSON API, a Flask application over the index.

Pages: the pending transactions (``/``), one transaction's timeline (``/transactions/ID``),
search (``/search``), discards and dead letters (``/refused``). JSON: ``/api/transactions``,
``/api/transactions/ID``, ``/api/search``, ``/api/refused``, ``/api/status``. An operator's
decision, ``POST /api/transactions/ID/resolve``, is taken only when the console was started
with an admin token and the request carries it (``Authorization: Bearer TOKEN``): else 403.
The token travels in a header, never a cookie, so another site's page cannot make a browser
send it.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from flask import Flask, abort, jsonify, redirect, render_template, request, url_for

from txstream.console.feed import FeederStatus
from txstream.console.index import Index
from txstream.console.queries import SORTS, TimelineRow, TxQuery
from txstream.console.timeline_text import describe_event, format_ms
from txstream.console.transaction_rows import IndexStatus, TxRow, keys_of
from txstream.errors import TxStreamError
from txstream.message import Decision

__all__ = ["create_app", "Resolver", "tx_json", "event_json", "format_age"]

log = logging.getLogger(__name__)

_DECISIONS = {"commit": Decision.COMMIT_MESSAGE, "rollback": Decision.ROLLBACK_MESSAGE}
_MAX_REASON_CHARS = 300


class Resolver(Protocol):
    """Writes an operator's decision
    (``txstream.streaming.cli.operator_decision.send_decision``, bound to the console's Kafka
    settings and topics); returns where it was written."""

    def __call__(self, txid: str, decision: Decision, operator: str, reason: str | None
                 ) -> Any: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


def format_age(ms: int | None) -> str:
    """A duration as an operator reads it: 850ms, 43.9s, 5m 02s, 3h 04m, 2d 03h."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24:02d}h"


def tx_json(row: TxRow, now_ms: int) -> dict[str, Any]:
    out = asdict(row)
    since = row.born_ms if row.born_ms is not None else row.first_seen_ms
    out["age_ms"] = now_ms - since if since is not None else None
    out["key_list"] = keys_of(row.keys)
    return out


def event_json(event: TimelineRow) -> dict[str, Any]:
    return {"at_ms": event.at_ms, "kind": event.kind, "source": event.source,
            "transaction_id": event.transaction_id, "text": describe_event(event),
            "origin": event.origin, "detail": event.detail}


def _statuses(text: str | None) -> tuple[str, ...]:
    """``open`` (the default of the pending page), ``all``/empty, or a comma-separated list."""
    text = (text or "").strip()
    if text.lower() == "open":
        return IndexStatus.OPEN
    if not text or text.lower() == "all":
        return ()
    return tuple(s.strip().upper() for s in text.split(",") if s.strip())


def _int_arg(args: Any, name: str, default: int) -> int:
    try:
        return int(args.get(name, default))
    except ValueError:
        abort(400, f"{name} is a number")


def _query(args: Any, default_status: str) -> TxQuery:
    sort = args.get("sort", "age")
    limit, offset = _int_arg(args, "limit", 200), _int_arg(args, "offset", 0)
    return TxQuery(statuses=_statuses(args.get("status", default_status)),
                   group=args.get("group") or None, text=(args.get("q") or "").strip() or None,
                   sort=sort if sort in SORTS else "age",
                   descending=args.get("order", "desc") != "asc", limit=limit, offset=offset)


def _bearer() -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def create_app(index: Index, *, status: Callable[[], FeederStatus] | None = None,
               resolver: Resolver | None = None, admin_token: str | None = None,
               default_operator: str = "console") -> Flask:
    """The console over ``index``. ``status``: the feed's, for the pages' header. Admin
    actions need both ``resolver`` and ``admin_token``."""
    app = Flask(__name__)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    admin = bool(admin_token) and resolver is not None
    app.jinja_env.filters.update(ms=format_ms, age=format_age)
    app.jinja_env.globals.update(admin=admin, statuses=IndexStatus.ALL, describe=describe_event)

    def feed_status() -> dict[str, Any]:
        s = status() if status else None
        return {"index": index.path, "caught_up_ms": s.caught_up_ms if s else None,
                "error": s.error if s else None, "records_read": s.records if s else 0,
                "admin": admin, "counts": index.counts(), "now_ms": _now_ms()}

    app.jinja_env.globals.update(feed_status=feed_status)
    _add_pages(app, index)
    _add_api(app, index, feed_status)
    _add_resolve(app, index, resolver if admin else None, admin_token or "", default_operator)
    return app


def _add_pages(app: Flask, index: Index) -> None:
    @app.get("/")
    def pending() -> str:
        query = _query(request.args, "open")
        rows, total = index.transactions(query)
        return render_template("pending.html", rows=rows, total=total, query=query,
                               groups=index.groups(), now=_now_ms(),
                               status_arg=request.args.get("status", "open"))

    @app.get("/transactions/<path:txid>")
    def transaction(txid: str) -> str:
        row = index.transaction(txid)
        events = index.events(txid)
        if row is None and not events:
            abort(404, f"no transaction {txid} in the index")
        return render_template("transaction.html", txid=txid, row=row, events=events,
                               now=_now_ms(), open_statuses=IndexStatus.OPEN)

    @app.get("/search")
    def search() -> Any:
        text = (request.args.get("q") or "").strip()
        rows = index.search(text) if text else []
        if len(rows) == 1:
            return redirect(url_for("transaction", txid=rows[0].transaction_id))
        return render_template("search.html", text=text, rows=rows, now=_now_ms())

    @app.get("/refused")
    def refused() -> str:
        sources = _refused_sources(request.args.get("source"))
        records, total = index.refused(sources)
        return render_template("refused.html", records=records, total=total,
                               source=request.args.get("source", ""))


def _refused_sources(text: str | None) -> tuple[str, ...]:
    if text in ("discard", "dead_letter"):
        return (text,)
    return ("discard", "dead_letter")


def _add_api(app: Flask, index: Index, feed_status: Callable[[], dict[str, Any]]) -> None:
    @app.get("/api/transactions")
    def api_transactions() -> Any:
        rows, total = index.transactions(_query(request.args, ""))
        now = _now_ms()
        return jsonify(total=total, transactions=[tx_json(r, now) for r in rows])

    @app.get("/api/transactions/<path:txid>")
    def api_transaction(txid: str) -> Any:
        row = index.transaction(txid)
        events = index.events(txid)
        if row is None and not events:
            return jsonify(error=f"no transaction {txid} in the index"), 404
        return jsonify(transaction=tx_json(row, _now_ms()) if row else None,
                       events=[event_json(e) for e in events])

    @app.get("/api/search")
    def api_search() -> Any:
        now = _now_ms()
        rows = index.search(request.args.get("q") or "")
        return jsonify(transactions=[tx_json(r, now) for r in rows])

    @app.get("/api/refused")
    def api_refused() -> Any:
        records, total = index.refused(_refused_sources(request.args.get("source")),
                                       limit=_int_arg(request.args, "limit", 200),
                                       offset=_int_arg(request.args, "offset", 0))
        return jsonify(total=total, records=[event_json(e) for e in records])

    @app.get("/api/status")
    def api_status() -> Any:
        return jsonify(feed_status())


def _add_resolve(app: Flask, index: Index, resolver: Resolver | None, token: str,
                 default_operator: str) -> None:
    @app.post("/api/transactions/<path:txid>/resolve")
    def api_resolve(txid: str) -> Any:
        if resolver is None:
            return jsonify(error="admin actions are off: start the console with "
                                 "--admin-token"), 403
        if not hmac.compare_digest(_bearer().encode(), token.encode()):
            return jsonify(error="a valid admin token is needed "
                                 "(Authorization: Bearer TOKEN)"), 403
        body = request.get_json(silent=True) or {}
        decision = _DECISIONS.get(str(body.get("decision", "")).lower())
        if decision is None:
            return jsonify(error='decision must be "commit" or "rollback"'), 400
        row = index.transaction(txid)
        if row is None or row.status not in IndexStatus.OPEN:
            state = row.status if row else "not in the index"
            return jsonify(error=f"{txid} is not pending ({state})"), 409
        operator = str(body.get("operator") or "").strip()[:100] or default_operator
        reason = str(body.get("reason") or "").strip()[:_MAX_REASON_CHARS] or None
        try:
            written = resolver(txid, decision, operator, reason)
        except TxStreamError as exc:
            return jsonify(error=str(exc)), 502
        where = f"{written.topic}[{written.partition}]@{written.offset}"
        # The console's own audit line, as `txstream resolve` prints it.
        log.info("console: %s for %s by %s written to %s at %s", decision.value, txid,
                    operator, where, format_ms(written.born_ms))
        return jsonify(decision=decision.value, transaction_id=txid, operator=operator,
                       reason=reason, written=where, born_ms=written.born_ms), 202
