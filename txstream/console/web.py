"""The console's pages and JSON API, a Flask application over the index.

Pages: the pending transactions (``/``), one transaction's timeline (``/transactions/ID``),
search (``/search``), discards and dead letters (``/refused``). JSON: ``/api/transactions``,
``/api/transactions/ID``, ``/api/search``, ``/api/refused``, ``/api/status``. An operator's
decision, ``POST /api/transactions/ID/resolve``, is taken only when the console was started
with an admin token and the request carries it (``Authorization: Bearer TOKEN``): else 403.
The token travels in a header, never a cookie, so another site's page cannot make a browser
send it.

Every answer carries the security headers (:data:`SECURITY_HEADERS`: the pages have no inline
script or style). Every error under ``/api/`` is JSON, ``{"status": code, "error": what}``;
elsewhere a page in the console's layout. Parameters are checked
(:mod:`txstream.console.web_params`).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from flask import Flask, Response, abort, jsonify, redirect, render_template, request, url_for
from werkzeug.exceptions import HTTPException

from txstream.console.feed import FeederStatus
from txstream.console.index import Index
from txstream.console.queries import TimelineRow
from txstream.console.timeline_text import describe_event, format_ms
from txstream.console.timeline_view import (
    Locate,
    message_properties,
    operators,
    release_json,
    releases,
    timeline_lines,
)
from txstream.console.transaction_rows import IndexStatus, TxRow, keys_of
from txstream.console.web_params import MAX_LIMIT, int_param, refused_sources, tx_query
from txstream.errors import TxStreamError
from txstream.message import Decision

__all__ = ["create_app", "Resolver", "ExtraPage", "tx_json", "event_json", "format_age",
           "SECURITY_HEADERS", "OVERDUE_GRACE_MS"]

log = logging.getLogger(__name__)

_DECISIONS = {"commit": Decision.COMMIT_MESSAGE, "rollback": Decision.ROLLBACK_MESSAGE}
_MAX_REASON_CHARS = 300
# A pending check this long past due is flagged: a running coordinator sends it within a
# trigger or two of its time (the history's late_ms), whatever the policy.
OVERDUE_GRACE_MS = 30_000
# The pages load their script and stylesheet from /static and nothing inline, so the policy
# allows nothing else; no page may be framed (clickjacking of the admin buttons).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


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


def tx_json(row: TxRow, now_ms: int, overdue_before_ms: int | None = None) -> dict[str, Any]:
    out = asdict(row)
    since = row.born_ms if row.born_ms is not None else row.first_seen_ms
    out["age_ms"] = now_ms - since if since is not None else None
    out["key_list"] = keys_of(row.keys)
    out["check_overdue"] = (overdue_before_ms is not None and row.status == IndexStatus.PENDING
                            and row.next_check_ms is not None
                            and row.next_check_ms < overdue_before_ms)
    return out


def event_json(event: TimelineRow) -> dict[str, Any]:
    return {"at_ms": event.at_ms, "kind": event.kind, "source": event.source,
            "transaction_id": event.transaction_id, "text": describe_event(event),
            "origin": event.origin, "detail": event.detail}


def _bearer() -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@dataclass(frozen=True)
class ExtraPage:
    """A page a program that runs the console adds to it (the recovery demo's chart): its
    title, its body (HTML made by that program, shown as it is) and, if it changes as it is
    watched, how often the browser asks for it again."""

    title: str
    body: str
    refresh_s: int | None = None


def _api_error(status: int, message: str) -> tuple[Response, int]:
    return jsonify(status=status, error=message), status


def create_app(index: Index, *, status: Callable[[], FeederStatus] | None = None,
               resolver: Resolver | None = None, admin_token: str | None = None,
               default_operator: str = "console", locate: Locate | None = None,
               overdue_grace_ms: int = OVERDUE_GRACE_MS,
               extra: Mapping[str, Callable[[], ExtraPage]] | None = None) -> Flask:
    """The console over ``index``. ``status``: the feed's, for the pages' header. Admin
    actions need both ``resolver`` and ``admin_token``. ``locate``: finds a release on its
    real topic. A pending check more than ``overdue_grace_ms`` past due is flagged overdue.
    ``extra``: pages of the running program's, by path (made at each request)."""
    app = Flask(__name__)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    admin = bool(admin_token) and resolver is not None
    app.jinja_env.filters.update(ms=format_ms, age=format_age)
    app.jinja_env.globals.update(admin=admin, statuses=IndexStatus.ALL, describe=describe_event)

    def feed_status() -> dict[str, Any]:
        s = status() if status else None
        now = _now_ms()
        # Judged as of the last catch-up: a check due since then may have been sent unread;
        # before the feed's first one, what the index holds may be old: nothing is judged.
        seen_at = now if s is None else s.caught_up_ms
        before = seen_at - overdue_grace_ms if seen_at is not None else 0
        life = index.liveness(before)
        counts = index.counts()
        return {"index": index.path, "caught_up_ms": s.caught_up_ms if s else None,
                "error": s.error if s else None, "records_read": s.records if s else 0,
                "admin": admin, "counts": counts,
                "open": sum(counts.get(x, 0) for x in IndexStatus.OPEN),
                "coordinator": {"last_note_ms": life.last_note_ms,
                                "overdue_checks": life.overdue,
                                "oldest_overdue_due_ms": life.oldest_due_ms,
                                "overdue_after_ms": overdue_grace_ms},
                "overdue_before_ms": before, "now_ms": now}

    def locate_now(topic: str, txid: str, released_ms: int) -> list[Any]:
        s = status() if status else None
        if s is not None and s.error:  # not another wait on an unreachable broker per page
            raise TxStreamError(f"the feed cannot read Kafka: {s.error}")
        assert locate is not None
        return locate(topic, txid, released_ms)

    app.jinja_env.globals.update(feed_status=feed_status)
    lookup = locate_now if locate is not None else None
    _add_guards(app)
    _add_pages(app, index, lookup)
    _add_api(app, index, feed_status, lookup)
    _add_resolve(app, index, resolver if admin else None, admin_token or "", default_operator)
    for path, make in (extra or {}).items():
        app.add_url_rule(path, f"extra:{path}",
                         lambda make=make: render_template("extra.html", page=make()))
    return app


def _add_guards(app: Flask) -> None:
    """Security headers on every answer; errors as JSON under /api/, as a page elsewhere."""
    @app.after_request
    def secure(response: Response) -> Response:
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        code = exc.code or 500
        message = exc.description or exc.name
        if request.path.startswith("/api/"):
            return _api_error(code, message)
        return render_template("error.html", code=code, name=exc.name, message=message), code

    @app.errorhandler(Exception)
    def crash(exc: Exception) -> Any:
        log.exception("console: %s %s failed", request.method, request.path)
        message = f"the console failed: {type(exc).__name__}: {exc}"
        if request.path.startswith("/api/"):
            return _api_error(500, message)
        try:
            return render_template("error.html", code=500, name="Internal error",
                                   message=message), 500
        except Exception:  # the page's header reads the index too, which may be what failed
            return Response(message, 500, mimetype="text/plain")


def _timeline_page(index: Index, locate: Locate | None, txid: str) -> str:
    row = index.transaction(txid)
    events = index.events(txid)
    if row is None and not events:
        abort(404, f"no transaction {txid} in the index: it may not have reached the "
                   "coordinator's topics yet, or the id is not a transaction id (search "
                   "finds message ids and keys)")
    lines = timeline_lines(row, events)
    return render_template("transaction.html", txid=txid, row=row, lines=lines,
                           start=lines[0].at_ms if lines else 0, now=_now_ms(),
                           open_statuses=IndexStatus.OPEN,
                           properties=message_properties(events),
                           operators=operators(row, events),
                           release=releases(index, locate, row, events))


def _add_pages(app: Flask, index: Index, locate: Locate | None) -> None:
    @app.get("/")
    def pending() -> str:
        query = tx_query(request.args, "open")
        rows, total = index.transactions(query)
        status_arg = (request.args.get("status") or "open").strip()
        return render_template("pending.html", rows=rows, total=total, query=query,
                               groups=index.groups(), now=_now_ms(), status_arg=status_arg,
                               title=_title(status_arg))

    @app.get("/transactions/<path:txid>")
    def transaction(txid: str) -> str:
        return _timeline_page(index, locate, txid)

    @app.get("/search")
    def search() -> Any:
        text = (request.args.get("q") or "").strip()
        rows = index.search(text) if text else []
        if len(rows) == 1:
            return redirect(url_for("transaction", txid=rows[0].transaction_id))
        return render_template("search.html", text=text, rows=rows, now=_now_ms())

    @app.get("/refused")
    def refused() -> str:
        sources = refused_sources(request.args)
        records, total = index.refused(sources)
        return render_template("refused.html", records=records, total=total,
                               source=request.args.get("source", ""))


def _title(status_arg: str) -> str:
    if status_arg.lower() == "open":
        return "Pending transactions"
    if status_arg.lower() in ("", "all"):
        return "All transactions"
    return f"Transactions: {status_arg.upper()}"


def _add_api(app: Flask, index: Index, feed_status: Callable[[], dict[str, Any]],
             locate: Locate | None) -> None:
    @app.get("/api/transactions")
    def api_transactions() -> Any:
        rows, total = index.transactions(tx_query(request.args, ""))
        now, overdue = _now_ms(), feed_status()["overdue_before_ms"]
        return jsonify(total=total, transactions=[tx_json(r, now, overdue) for r in rows])

    @app.get("/api/transactions/<path:txid>")
    def api_transaction(txid: str) -> Any:
        row = index.transaction(txid)
        events = index.events(txid)
        if row is None and not events:
            return _api_error(404, f"no transaction {txid} in the index")
        overdue = feed_status()["overdue_before_ms"]
        return jsonify(transaction=tx_json(row, _now_ms(), overdue) if row else None,
                       properties=message_properties(events),
                       operators=operators(row, events),
                       release=release_json(releases(index, locate, row, events)),
                       events=[event_json(e) for e in events])

    @app.get("/api/search")
    def api_search() -> Any:
        text = (request.args.get("q") or "").strip()
        if not text:
            return _api_error(400, "q must be a transaction id, message id or business key")
        rows = index.search(text, limit=int_param(request.args, "limit", 50, 1, MAX_LIMIT))
        now, overdue = _now_ms(), feed_status()["overdue_before_ms"]
        return jsonify(transactions=[tx_json(r, now, overdue) for r in rows])

    @app.get("/api/refused")
    def api_refused() -> Any:
        records, total = index.refused(
            refused_sources(request.args),
            limit=int_param(request.args, "limit", 200, 1, MAX_LIMIT),
            offset=int_param(request.args, "offset", 0, 0, 2**62))
        return jsonify(total=total, records=[event_json(e) for e in records])

    @app.get("/api/status")
    def api_status() -> Any:
        return jsonify(feed_status())


def _add_resolve(app: Flask, index: Index, resolver: Resolver | None, token: str,
                 default_operator: str) -> None:
    @app.post("/api/transactions/<path:txid>/resolve")
    def api_resolve(txid: str) -> Any:
        if resolver is None:
            return _api_error(403, "admin actions are off: start the console with "
                                   "--admin-token")
        if not hmac.compare_digest(_bearer().encode(), token.encode()):
            return _api_error(403, "a valid admin token is needed "
                                   "(Authorization: Bearer TOKEN)")
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            return _api_error(400, 'the body must be a JSON object: {"decision": "commit" '
                                   'or "rollback", "operator": ..., "reason": ...}')
        decision = _DECISIONS.get(str(body.get("decision", "")).lower())
        if decision is None:
            return _api_error(400, 'decision must be "commit" or "rollback"')
        row = index.transaction(txid)
        if row is None or row.status not in IndexStatus.OPEN:
            state = row.status if row else "not in the index"
            return _api_error(409, f"{txid} is not pending ({state})")
        operator = str(body.get("operator") or "").strip()[:100] or default_operator
        reason = str(body.get("reason") or "").strip()[:_MAX_REASON_CHARS] or None
        try:
            written = resolver(txid, decision, operator, reason)
        except TxStreamError as exc:
            return _api_error(502, str(exc))
        where = f"{written.topic}[{written.partition}]@{written.offset}"
        # The console's own audit line, as `txstream resolve` prints it.
        log.info("console: %s for %s by %s written to %s at %s", decision.value, txid,
                 operator, where, format_ms(written.born_ms))
        return jsonify(decision=decision.value, transaction_id=txid, operator=operator,
                       reason=reason, written=where, born_ms=written.born_ms), 202
