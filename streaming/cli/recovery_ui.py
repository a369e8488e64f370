"""The recovery demo in the console (``txstream demo --recovery --ui``): the console over the
demo's topics, with the run's chart as a page of its own, ``/recovery``, drawn again at each
request while the run goes on (the browser asks every 2 s), then the final chart with the
verdict. The same chart as ``recovery.html``: :mod:`txstream.streaming.cli.recovery_chart`.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txstream.console.server import ConsoleServer
from txstream.console.web import ExtraPage
from txstream.kafka import KafkaSettings
from txstream.streaming.cli.recovery_chart import render_svg
from txstream.topics import Topics

__all__ = ["RECOVERY_PATH", "REFRESH_S", "chart_page", "start_console"]

RECOVERY_PATH = "/recovery"
REFRESH_S = 2


def chart_page(data: dict[str, Any], final: bool) -> ExtraPage:
    """The console's page of a chart (``chart_data``'s): asked again until ``final``."""
    verdict = "\n".join(data.get("verdict") or ["the run goes on: the verdict comes at its end"])
    body = (f"{render_svg(data)}\n<pre id=\"recovery-verdict\">{html.escape(verdict)}</pre>")
    return ExtraPage("Recovery demo: released messages per second", body,
                     None if final else REFRESH_S)


def start_console(folder: Path, settings: KafkaSettings, topics: Topics, port: int,
                  page: Callable[[], ExtraPage]) -> ConsoleServer:
    """The console on loopback ``port`` (0: a free one), its index in the demo's folder."""
    return ConsoleServer(folder / "console.sqlite", settings, topics, port=port,
                         extra={RECOVERY_PATH: page}).start()
