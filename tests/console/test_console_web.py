"""``txstream console`` against a real coordinator (local Spark, the tansu broker): its JSON
API, the admin token, the command itself, and its pages driven in a real headless browser
(Debian's chromium, through playwright)."""

from __future__ import annotations

import functools
import json
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from tests.support.console_helpers import Coordinator, produce_unknown, start_console_coordinator
from tests.support.kafka_helpers import (
    discard_by_answers,
    headers_of,
    produce,
    read_topic,
    wait_until,
)
from txstream.console.server import ConsoleServer
from txstream.console.web import SECURITY_HEADERS
from txstream.kafka import KafkaSettings
from txstream.streaming.cli.operator_decision import send_decision
from txstream.wire import Record

pytestmark = pytest.mark.spark

TOKEN = "s3cret-admin-token"
SCREENSHOT = Path("/tmp/console-screenshot.png")
# RocketMQ's transaction example: its producer group and topic.
SEED_GROUP, SEED_TOPIC = "please_rename_unique_group_name", "TopicTest1234"


@pytest.fixture(scope="module")
def coord(spark: Any, kafka: KafkaSettings, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Coordinator]:
    running = start_console_coordinator(spark, kafka, tmp_path_factory.mktemp("web-cp"))
    yield running
    running.query.stop()


@pytest.fixture(scope="module")
def plain(coord: Coordinator) -> Iterator[ConsoleServer]:
    """A console without an admin token."""
    with ConsoleServer(":memory:", coord.kafka, coord.topics, port=0).start() as server:
        yield server


@pytest.fixture(scope="module")
def admin(coord: Coordinator, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[ConsoleServer]:
    """A console with an admin token, on an index file."""
    path = tmp_path_factory.mktemp("web-index") / "console.sqlite"
    resolver = functools.partial(send_decision, coord.kafka, coord.topics)
    with ConsoleServer(path, coord.kafka, coord.topics, port=0, admin_token=TOKEN,
                       resolver=resolver, operator="console-test").start() as server:
        yield server


def _call(url: str, body: dict[str, Any] | None = None, token: str | None = None
          ) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers,
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _tx(server: ConsoleServer, txid: str) -> dict[str, Any] | None:
    status, body = _call(f"{server.url}/api/transactions/{quote(txid)}")
    return body["transaction"] if status == 200 else None


def _pending_with_a_check(server: ConsoleServer, txid: str) -> dict[str, Any]:
    return wait_until(lambda: (t := _tx(server, txid)) and t["status"] == "PENDING"
                      and t["checks_sent"] >= 1 and t, timeout_s=60)


def test_the_json_api_lists_searches_and_shows_a_pending_transaction(
    coord: Coordinator, plain: ConsoleServer, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    group, real, key = f"{unique}-g", f"{unique}-real", f"{unique}-order"
    txid = produce_unknown(coord, capsys, group, real, "api", "--keys", f"{key} other-key")
    tx = _pending_with_a_check(plain, txid)
    assert (tx["producer_group"], tx["real_topic"], tx["keys"]) == (group, real,
                                                                     f"{key} other-key")
    assert tx["age_ms"] >= 1000 and tx["checks_answered"] == 0 and tx["next_check_ms"]

    query = urlencode({"status": "PENDING", "group": group})
    status, body = _call(f"{plain.url}/api/transactions?{query}")
    assert status == 200 and body["total"] == 1
    assert [t["transaction_id"] for t in body["transactions"]] == [txid]
    status, body = _call(f"{plain.url}/api/transactions?{urlencode({'q': key})}")
    assert [t["transaction_id"] for t in body["transactions"]] == [txid]
    status, body = _call(f"{plain.url}/api/transactions?status=COMMITTED&group={group}")
    assert (status, body["total"]) == (200, 0)
    status, body = _call(f"{plain.url}/api/search?{urlencode({'q': key})}")
    assert [t["transaction_id"] for t in body["transactions"]] == [txid]

    status, body = _call(f"{plain.url}/api/transactions/{quote(txid)}")
    kinds = [e["kind"] for e in body["events"]]
    assert status == 200 and {"half_record", "half", "check_sent"} <= set(kinds)
    half = next(e for e in body["events"] if e["kind"] == "half")
    assert half["text"].startswith(f"half message registered: group {group}, real topic {real}")
    assert _call(f"{plain.url}/api/transactions/{unique}-nothing")[0] == 404
    status, body = _call(f"{plain.url}/api/status")
    assert status == 200 and body["admin"] is False and body["counts"]["PENDING"] >= 1
    assert body["caught_up_ms"] is not None and body["error"] is None


def test_resolve_needs_the_admin_token(
    coord: Coordinator, plain: ConsoleServer, admin: ConsoleServer,
    capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    txid = produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "guarded")
    _pending_with_a_check(admin, txid)
    _pending_with_a_check(plain, txid)
    path = f"/api/transactions/{quote(txid)}/resolve"
    commit = {"decision": "commit", "operator": "mallory"}
    status, body = _call(plain.url + path, commit, token=TOKEN)  # no token configured there
    assert status == 403 and "--admin-token" in body["error"]
    for token in (None, "", "wrong", TOKEN + "x"):
        status, body = _call(admin.url + path, commit, token=token)
        assert status == 403, token
    assert _call(admin.url + path, {"decision": "maybe"}, token=TOKEN)[0] == 400
    assert _call(admin.url + f"/api/transactions/{unique}-none/resolve", commit,
                 token=TOKEN)[0] == 409
    # Nothing was written: it is still pending, no decision in its timeline.
    status, body = _call(f"{admin.url}/api/transactions/{quote(txid)}")
    assert body["transaction"]["status"] == "PENDING"
    assert not [e for e in body["events"] if e["detail"].get("operator")]


def test_an_operator_commits_through_the_api(
    coord: Coordinator, admin: ConsoleServer, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    txid = produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "by the api")
    _pending_with_a_check(admin, txid)
    path = f"{admin.url}/api/transactions/{quote(txid)}/resolve"
    status, body = _call(path, {"decision": "commit", "operator": "bob", "reason": "verified"},
                         token=TOKEN)
    assert status == 202, body
    assert (body["decision"], body["operator"]) == ("COMMIT_MESSAGE", "bob")
    assert body["written"].startswith(coord.topics.end + "[")
    tx = wait_until(lambda: (t := _tx(admin, txid)) and t["status"] == "COMMITTED" and t,
                    timeout_s=60)
    assert (tx["outcome"], tx["operator"], tx["reason"]) == ("released", "bob", "verified")
    # Settled: a second decision is refused by the console itself.
    assert _call(path, {"decision": "rollback"}, token=TOKEN)[0] == 409


def test_the_console_command_serves_until_sigterm(coord: Coordinator, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "txstream.streaming.cli", "console", *coord.args, "--port", "0",
         "--index", str(tmp_path / "cli.sqlite")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("txstream console on http://127.0.0.1:"), first
        url = first.split()[3]
        assert "admin actions off" in first
        status, body = wait_until(lambda: (a := _call(f"{url}/api/status"))
                                  and a[1]["caught_up_ms"] and a, timeout_s=30)
        assert status == 200 and body["counts"]["events"] > 0
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest
    assert "stopping the console" in rest


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("no chromium on this machine: scripts/setup.sh installs Debian's")
    return path


def _seed_like(coord: Coordinator, plain: ConsoleServer, admin: ConsoleServer,
               capsys: pytest.CaptureFixture[str], unique: str) -> tuple[list[str], str]:
    """The seed's transactions that answer UNKNOW, pending until someone decides, and one
    discarded at once; their ids once both consoles show them."""
    group, topic = f"{SEED_GROUP}_{unique}", f"{SEED_TOPIC}_{unique}"
    txids = [produce_unknown(coord, capsys, group, topic, f"Hello RocketMQ {i}", "--keys",
                             f"KEY{i}", "--tags", "TagA") for i in (0, 3, 6)]
    for server in (plain, admin):
        _pending_with_a_check(server, txids[0])
    old = f"{unique}-old"
    # Its own group: nobody else answers its checks; two UNKNOW answers reach check_max.
    discard_by_answers(coord.kafka, coord.topics, old, f"{unique}-g", topic)
    wait_until(lambda: (t := _tx(plain, old)) and t["status"] == "DISCARDED", timeout_s=60)
    return txids, old


def _browse_without_a_token(page: Any, url: str, txids: list[str], old: str, unique: str,
                            shots: Path) -> None:
    from playwright.sync_api import expect

    txid, group = txids[0], f"{SEED_GROUP}_{unique}"
    # The pending page, filtered to the seed's group, sorted by age.
    page.goto(url + "/")
    row = page.locator(f'#transactions tr[data-txid="{txid}"]')
    expect(row).to_contain_text(f"{SEED_TOPIC}_{unique}")
    page.select_option("#filter-group", group)
    page.click("#filters button[type=submit]")
    expect(page.locator("#transactions tbody tr")).to_have_count(3)
    expect(row).to_contain_text("KEY0")
    assert "/ 0" in row.locator("td").nth(6).inner_text()  # checks sent / answered
    page.click("a.sort[data-sort=age]")  # oldest first by default: now the newest
    page.wait_for_url("**order=asc**")
    shown = page.locator("#transactions tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.txid)")
    assert shown == txids[::-1]
    page.screenshot(path=str(shots / "pending.png"), full_page=True)

    # Its timeline, with no admin buttons on a console without a token.
    row.locator("td.id a").click()
    page.wait_for_url(f"**/transactions/{txid}")
    expect(page.locator("#tx-status")).to_have_text("PENDING")
    expect(page.locator("#timeline tr[data-kind=half]")).to_contain_text(
        f"half message registered: group {group}")
    expect(page.locator("#timeline tr[data-kind=check_sent]").first).to_be_visible()
    expect(page.locator("#admin")).to_have_count(0)
    expect(page.get_by_role("button", name="Roll back")).to_have_count(0)

    # Search by business key leads to that transaction's timeline.
    page.fill("#search-box", "KEY3")
    page.press("#search-box", "Enter")
    page.wait_for_url(f"**/transactions/{txids[1]}")

    # The discard, with its reason.
    page.click("#nav-refused")
    expect(page.locator("#refused tr[data-kind=discard_record]").filter(has_text=old)
           ).to_contain_text("still unknown after 2 answered checks")


def _roll_back_with_the_token(page: Any, url: str, txid: str, shot: Path) -> None:
    from playwright.sync_api import expect

    page.goto(f"{url}/transactions/{txid}")
    page.fill("#admin-token", "wrong")
    page.click("#btn-rollback")
    expect(page.locator("#admin-result")).to_contain_text("refused (403)")
    expect(page.locator("#tx-status")).to_have_text("PENDING")
    page.fill("#admin-token", TOKEN)
    page.fill("#admin-operator", "alice")
    page.fill("#admin-reason", "customer cancelled")
    page.click("#btn-rollback")
    expect(page.locator("#tx-status")).to_have_text("ROLLED_BACK", timeout=90_000)
    expect(page.locator("#timeline tr[data-kind=rolled_back]")).to_contain_text(
        "admin decision by alice")
    expect(page.locator("#tx-reason")).to_have_text("customer cancelled")
    expect(page.locator("#admin")).to_have_count(0)  # settled: nothing more to decide
    page.screenshot(path=str(shot), full_page=True)


def test_the_pages_in_a_headless_browser(
    coord: Coordinator, plain: ConsoleServer, admin: ConsoleServer,
    capsys: pytest.CaptureFixture[str], unique: str, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    txids, old = _seed_like(coord, plain, admin, capsys, unique)
    shot = tmp_path / "timeline.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            _browse_without_a_token(page, plain.url, txids, old, unique, tmp_path)
            _roll_back_with_the_token(page, admin.url, txids[0], shot)
        finally:
            browser.close()
    shutil.copy(shot, SCREENSHOT)
    shutil.copy(tmp_path / "pending.png", SCREENSHOT.with_name("console-pending.png"))
    assert SCREENSHOT.stat().st_size > 10_000


def _commit_as_carol(page: Any, url: str, txid: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{url}/transactions/{txid}")
    page.fill("#admin-token", TOKEN)
    page.fill("#admin-operator", "carol")
    page.fill("#admin-reason", "paid by phone")
    page.click("#btn-commit")
    expect(page.locator("#tx-status")).to_have_text("COMMITTED", timeout=90_000)


def _check_the_timeline(page: Any, coord: Coordinator, txid: str, real: str, shot: Path
                        ) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#tx-operator")).to_have_text("carol")
    expect(page.locator("#timeline tr[data-kind=released]")).to_contain_text(
        "admin decision by carol")
    # The release's history note may be read a moment before its record is acknowledged (two
    # tasks of one batch): the page looks it up again until it finds it.
    def located() -> bool:
        page.reload()
        return "partition" in page.inner_text("#tx-release")

    wait_until(located, timeout_s=30)
    expect(page.locator("#tx-release")).to_contain_text(real)
    properties = page.locator("#properties")
    expect(properties).to_contain_text("color")
    expect(properties).to_contain_text("eu-west")
    # The timeline starts at the born time: no "+" before it, first check after it.
    kinds = page.locator("#timeline tbody tr").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert kinds[0] == "born", kinds
    offsets = page.locator("#timeline td.num").all_inner_texts()
    assert offsets[0] == "+0ms" and all(o.startswith("+") and "-" not in o for o in offsets)
    page.screenshot(path=str(shot), full_page=True)


def _released_record(coord: Coordinator, location: dict[str, Any]) -> dict[str, str]:
    [record] = [r for r in read_topic(coord.kafka, location["topic"])
                if (r.partition, r.offset) == (location["partition"], location["offset"])]
    return headers_of(record)


def test_a_timeline_shows_where_it_was_released_its_properties_and_its_operator(
    coord: Coordinator, admin: ConsoleServer, capsys: pytest.CaptureFixture[str], unique: str,
    tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    real = f"{unique}-real"
    txid = produce_unknown(coord, capsys, f"{unique}-g", real, "for carol", "--keys",
                           f"{unique}-k", "--property", "color=blue", "--property",
                           "region=eu-west")
    _pending_with_a_check(admin, txid)
    raw = f"{unique}-raw"  # a half message with no headers at all: dead-lettered
    produce(coord.kafka, [Record(coord.topics.half, raw.encode(), b"no headers", ())])
    shot = tmp_path / "released.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            answers: list[Any] = []
            page.on("response", lambda r: answers.append(r))
            blocked: list[str] = []
            page.on("console", lambda m: blocked.append(m.text)
                    if "Content Security Policy" in m.text else None)
            _commit_as_carol(page, admin.url, txid)
            _check_the_timeline(page, coord, txid, real, shot)

            wait_until(lambda: (t := _tx(admin, raw)) and t["status"] == "REFUSED", 60)
            page.goto(f"{admin.url}/transactions/{raw}")
            expect(page.locator("#tx-status")).to_have_text("REFUSED")
            expect(page.locator("#timeline tr[data-kind=dead_letter]")).to_contain_text(
                "half message refused")
            expect(page.locator("#timeline tr[data-kind=half_record]")).to_contain_text(
                "no headers")
            for path in ("/", "/?status=all", "/?status=REFUSED", "/refused",
                         f"/search?q={unique}", f"/transactions/{raw}", f"/transactions/{txid}"):
                page.goto(admin.url + path)
                assert "None" not in page.inner_text("body"), path
            expect(page.locator("#page-title")).to_have_count(0)  # a timeline, not a list
            page.goto(admin.url + "/?status=all")
            expect(page.locator("#page-title")).to_have_text("All transactions")
            assert page.title().startswith("All transactions")
        finally:
            browser.close()
    assert blocked == []
    for answer in answers:
        for name, value in SECURITY_HEADERS.items():
            assert answer.headers.get(name.lower()) == value, (answer.url, name)
    shutil.copy(shot, SCREENSHOT.with_name("console-released.png"))
    _, body = _call(f"{admin.url}/api/transactions/{quote(txid)}")
    [location] = body["release"]["locations"]
    assert location["topic"] == real
    assert _released_record(coord, location)["__transactionId__"] == txid
    assert body["properties"] == {"color": "blue", "region": "eu-west"}
    assert body["operators"] == ["carol"]
