"""The recovery demo's chart in the console (``--ui``), in a real browser: the page the
console adds for it shows the crash while the run goes on, asks again every few seconds,
and shows the verdict once there is one."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

from txstream.console.index import Index
from txstream.console.web import SECURITY_HEADERS, create_app
from txstream.streaming.cli.recovery_chart import chart_data
from txstream.streaming.cli.recovery_crash import Crash
from txstream.streaming.cli.recovery_ui import RECOVERY_PATH, REFRESH_S, chart_page
from txstream.streaming.cli.recovery_watch import Release

T0 = 1_800_000_000.0
VERDICT = "PASS: lost 0, doubled 0, pending 0"


def _data(final: bool) -> dict[str, Any]:
    crash = Crash(1, T0 + 5.2, 7, True, 12, [Release("A", T0 + 5.1, 0, 3)], 0,
                  restart_at=T0 + 8.0, first_release_at=T0 + 30.5 if final else None)
    releases = [Release("A", T0 + 5.1, 0, 3), Release("B", T0 + 30.6, 0, 4)]
    return chart_data(started=T0, ended=T0 + (40 if final else 12), releases=releases,
                      commits=[T0 + 1.5], crashes=[crash], pauses=[],
                      verdict=[VERDICT] if final else [])


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[str, dict[str, bool]]]:
    """A console with the chart page; ``state["final"]`` ends the run."""
    state = {"final": False}
    index = Index(tmp_path / "console.sqlite")
    app = create_app(index, extra={
        RECOVERY_PATH: lambda: chart_page(_data(state["final"]), state["final"])})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        index.close()


def test_the_chart_page_follows_the_run_in_a_browser(
        console: tuple[str, dict[str, bool]]) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, state = console
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium on this machine: scripts/setup.sh installs Debian's"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True)
        try:
            page = browser.new_page()
            answer = page.goto(url + RECOVERY_PATH)
            assert answer is not None and answer.status == 200
            assert answer.headers["content-security-policy"] == SECURITY_HEADERS[
                "Content-Security-Policy"]  # the console's own guards
            expect(page.locator("h1")).to_have_text("Recovery demo: released messages per second")
            expect(page.locator("#extra-page svg line.mark.crash")).to_have_count(1)
            expect(page.locator("#recovery-verdict")).to_contain_text("the run goes on")
            state["final"] = True  # the page asks again by itself, and then no more
            expect(page.locator("#recovery-verdict")).to_have_text(
                VERDICT, timeout=(REFRESH_S + 5) * 1000)
            expect(page.locator("#extra-page svg line.mark.first_release")).to_have_count(1)
            assert page.locator("meta[http-equiv=refresh]").count() == 0
        finally:
            browser.close()
