"""The console over the topics of a coordinator that has stopped (the tansu broker, no Spark):
the coordinator-down state in a real headless browser, the JSON API's errors, each a JSON body
with its status, and the security headers on every answer.

The history is written by the coordinator's own encoder (``txstream.outputs.encode_history``),
as a coordinator that wrote these notes and then died left it: a half message registered ten
minutes ago whose checks fell due and were never sent.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kafka_helpers import half_record, now_ms, produce, wait_until
from txstream.console.server import ConsoleServer
from txstream.console.web import SECURITY_HEADERS
from txstream.kafka import KafkaSettings
from txstream.kafka.provision import admin_client, coordinator_topics, create_topics
from txstream.outputs import encode_history
from txstream.topics import Topics

DOWN_SHOT = Path("/tmp/console-coordinator-down.png")


class Stopped:
    """What a stopped coordinator left on its topics."""

    def __init__(self, kafka: KafkaSettings, topics: Topics) -> None:
        self.kafka, self.topics = kafka, topics
        start = now_ms() - 10 * 60_000
        self.txid, self.group, self.real = "stuck-0001", "shop", "Orders"
        self.last_note_ms = start + 4_000
        notes = [(self.txid, start + 5, "half", {"group": self.group, "topic": self.real,
                                                 "first_check": start + 2_000}),
                 (self.txid, start + 2_000, "check_sent", {"check": 1, "late_ms": 0,
                                                           "next_check": start + 6_000}),
                 ("settled-0002", self.last_note_ms, "released",
                  {"decision": "COMMIT_MESSAGE", "from_check": False})]
        records = [record for record, _ in encode_history(notes, b"3", topics)]
        records.append(half_record(topics, self.txid, self.group, self.real, born_ms=start,
                                   keys="order-7"))
        produce(kafka, records)


@pytest.fixture(scope="module")
def stopped(kafka: KafkaSettings) -> Stopped:
    import uuid

    topics = Topics.with_prefix(f"s{uuid.uuid4().hex[:8]}_")
    with admin_client(kafka) as admin:
        create_topics(admin, coordinator_topics(topics, partitions=1))
    return Stopped(kafka, topics)


@pytest.fixture(scope="module")
def console(stopped: Stopped) -> Iterator[ConsoleServer]:
    with ConsoleServer(":memory:", stopped.kafka, stopped.topics, port=0).start() as server:
        # Overdue checks are judged as of a completed catch-up, never before the first one.
        wait_until(lambda: _get(f"{server.url}/api/transactions/{stopped.txid}")[0] == 200
                   and json.loads(_get(f"{server.url}/api/status")[2])["caught_up_ms"],
                   timeout_s=60)
        yield server


def _get(url: str, method: str = "GET", data: bytes | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _assert_secure(headers: dict[str, str], url: str) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (url, name, headers.get(name))


def test_the_json_api_says_the_coordinator_is_down(console: ConsoleServer,
                                                   stopped: Stopped) -> None:
    status, _, body = _get(f"{console.url}/api/status")
    coordinator = json.loads(body)["coordinator"]
    assert status == 200
    assert coordinator["last_note_ms"] == stopped.last_note_ms
    assert coordinator["overdue_checks"] == 1
    assert coordinator["oldest_overdue_due_ms"] < now_ms() - 9 * 60_000
    status, _, body = _get(f"{console.url}/api/transactions/{stopped.txid}")
    assert json.loads(body)["transaction"]["check_overdue"] is True


# (path, status, named in the error): bad parameters, unknown ids and routes (a wrong method:
# test_resolve_errors_are_json_too). Every one must be a
# JSON body {"status": code, "error": what is wrong}.
BAD_CALLS = [
    ("/api/transactions?limit=abc", 400, "limit"),
    ("/api/transactions?limit=-1", 400, "limit"),
    ("/api/transactions?limit=0", 400, "limit"),
    ("/api/transactions?limit=1001", 400, "limit"),
    ("/api/transactions?offset=-5", 400, "offset"),
    ("/api/transactions?offset=x", 400, "offset"),
    ("/api/transactions?status=PENDING,BOGUS", 400, "BOGUS"),
    ("/api/transactions?sort=price", 400, "sort"),
    ("/api/transactions?order=sideways", 400, "order"),
    ("/api/refused?source=everything", 400, "source"),
    ("/api/refused?limit=1e3", 400, "limit"),
    ("/api/search", 400, "q"),
    ("/api/search?q=x&limit=many", 400, "limit"),
    ("/api/transactions/no-such-transaction", 404, "no-such-transaction"),
    ("/api/transactions/a%20b%2F%3Cc%3E", 404, "a b/<c>"),
    ("/api/nothing-here", 404, ""),
]


@pytest.mark.parametrize(("path", "code", "names"), BAD_CALLS)
def test_every_api_error_is_json_with_its_status(console: ConsoleServer, path: str, code: int,
                                                 names: str) -> None:
    status, headers, body = _get(console.url + path)
    assert status == code, body
    assert headers["Content-Type"] == "application/json", body
    answer = json.loads(body)
    assert answer["status"] == code and isinstance(answer["error"], str) and answer["error"]
    assert names in answer["error"]
    _assert_secure(headers, path)


def test_resolve_errors_are_json_too(console: ConsoleServer, stopped: Stopped) -> None:
    url = f"{console.url}/api/transactions/{stopped.txid}/resolve"
    for data in (b"{}", b"not json", b'{"decision": "commit"}'):
        status, headers, body = _get(url, "POST", data)
        assert (status, json.loads(body)["status"]) == (403, 403)  # no admin token here
        assert headers["Content-Type"] == "application/json"
    status, headers, body = _get(f"{console.url}/api/status", "POST", b"{}")
    assert (status, json.loads(body)["status"]) == (405, 405)


def test_good_parameters_still_answer(console: ConsoleServer, stopped: Stopped) -> None:
    for path in ("/api/transactions?limit=1000&offset=0&sort=next_check&order=asc",
                 "/api/transactions?status=open", "/api/transactions?status=all",
                 "/api/refused?source=dead_letter&limit=1", f"/api/search?q={stopped.txid}"):
        status, _, body = _get(console.url + path)
        assert status == 200, (path, body)


def test_pages_answer_in_the_console_layout(console: ConsoleServer) -> None:
    status, headers, body = _get(f"{console.url}/transactions/no-such-transaction")
    text = body.decode()
    assert status == 404 and headers["Content-Type"].startswith("text/html")
    assert "txstream console" in text and "no transaction no-such-transaction" in text
    status, _, body = _get(f"{console.url}/?limit=abc")
    assert status == 400 and "limit must be a whole number" in body.decode()
    for path in ("/", "/static/console.js", "/static/console.css", "/nowhere"):
        _assert_secure(_get(console.url + path)[1], path)


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("no chromium on this machine: scripts/setup.sh installs Debian's")
    return path


def test_the_pages_show_the_coordinator_down(console: ConsoleServer, stopped: Stopped,
                                             tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            blocked: list[str] = []
            page.on("console", lambda m: blocked.append(m.text)
                    if "Content Security Policy" in m.text else None)
            page.goto(console.url + "/")
            alarm = page.locator("#coordinator-down")
            expect(alarm).to_contain_text("The coordinator looks down or stuck")
            expect(alarm).to_contain_text("1 pending check(s) overdue")
            # The page may load seconds after the fixture wrote: the ages are minutes, not exact.
            expect(page.locator("#coordinator-last")).to_contain_text(
                re.compile(r"\((9m 5\d|1[01]m \d\d)s ago\)"))
            cell = page.locator(f'#transactions tr[data-txid="{stopped.txid}"] td.overdue')
            expect(cell).to_contain_text(re.compile(r"overdue (9|10|11)m"))
            page.screenshot(path=str(tmp_path / "down.png"), full_page=True)
            page.goto(f"{console.url}/transactions/{stopped.txid}")
            expect(page.locator("#coordinator-down")).to_be_visible()
            assert "None" not in page.inner_text("body")
            assert blocked == []
        finally:
            browser.close()
    shutil.copy(tmp_path / "down.png", DOWN_SHOT)
