"""Prometheus metrics of a running coordinator: ``txstream run --metrics-port PORT``.

A custom collector reads :meth:`CoordinatorStats.snapshot` at scrape time, so the figures are
exactly those the progress lines print (Spark's observed metrics, batch by batch) and nothing
is counted twice. Each server has its own registry: several coordinators (or tests) in one
process never share a counter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import start_wsgi_server
from prometheus_client.registry import Collector

from streaming.engine.progress import CoordinatorStats

__all__ = ["serve_metrics", "MetricsServer", "StatsCollector", "COUNTER_HELP", "GAUGES"]

# snapshot key -> help text. Prometheus appends ``_total`` to counter names.
COUNTER_HELP: dict[str, str] = {
    "halves": "half messages registered",
    "released": "messages released to their real topic (committed)",
    "rolled_back": "transactions rolled back",
    "checks_sent": "back-checks sent to producers",
    "discarded": "half messages discarded (check max or reserved time reached)",
    "dead_letters": "records refused to the dead-letter topic",
    "rejected": "end events refused (wrong group, contradicting decision)",
    "duplicates": "duplicate half messages or end events recognised",
    "expired": "end events dead-lettered because their half message never came",
    "batches": "micro-batches completed",
    "input_rows": "records read from the half and end topics",
}

# metric name -> (snapshot key, scale to base unit, help). Durations in seconds (Prometheus).
GAUGES: dict[str, tuple[str, float, str]] = {
    "txstream_pending": ("pending", 1.0,
                         "transactions seen by this process and not resolved yet"),
    "txstream_last_batch_seconds": ("last_batch_ms", 0.001,
                                    "duration of the last micro-batch"),
    "txstream_check_lateness_max_seconds": ("check_late_max_ms", 0.001,
                                            "latest a back-check was sent after it was due"),
    "txstream_commit_to_visible_avg_seconds": ("visible_lag_avg_ms", 0.001,
                                               "average time from a commit's send to release"),
    "txstream_commit_to_visible_max_seconds": ("visible_lag_max_ms", 0.001,
                                               "longest time from a commit's send to release"),
}


class StatsCollector(Collector):
    """Turns one :class:`CoordinatorStats` into Prometheus metrics at every scrape."""

    def __init__(self, stats: CoordinatorStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        snap = self.stats.snapshot()
        for key, text in COUNTER_HELP.items():
            yield CounterMetricFamily(f"txstream_{key}", text, value=float(snap.get(key, 0)))
        for name, (key, scale, text) in GAUGES.items():
            yield GaugeMetricFamily(name, text, value=float(snap.get(key, 0)) * scale)


class MetricsServer:
    """The HTTP server behind ``/metrics``; ``close()`` stops it and frees the port."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._httpd.server_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve_metrics(port: int, stats: CoordinatorStats, host: str = "0.0.0.0") -> MetricsServer:
    """Serve ``stats`` on ``http://HOST:PORT/metrics`` from a daemon thread.

    ``host`` defaults to all interfaces (a scraper in another container must reach it);
    ``port=0`` picks a free port (see ``MetricsServer.port``).
    """
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector(stats))
    httpd, thread = start_wsgi_server(port, addr=host, registry=registry)
    return MetricsServer(httpd, thread)
