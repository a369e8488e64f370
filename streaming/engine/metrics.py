"""Prometheus metrics and ``/healthz`` of a running coordinator: ``txstream run --metrics-port``.

Collectors read the driver's figures at scrape time: the labelled counters, histograms and open
transactions the keys reported and the batches counted (:class:`MetricsBoard`), the input lag
(:class:`LagWatch`) and the driver's heap. So nothing is counted twice, and every figure is
Spark's own, batch by batch. What a key tallies, and its help text, is said once, in
:mod:`txstream.streaming.engine.key_metrics` (``Counted``, ``Timed``). Each server has its
own registry: several coordinators (or tests) in one process never share a counter. The
metric names and their labels are listed in docs/operations.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from txstream.streaming.engine.health import (
    HealthCheck,
    HealthThresholds,
    LagReading,
    LagWatch,
    query_problem,
)
from txstream.streaming.engine.key_metrics import BUCKETS_MS, Counted, Timed
from txstream.streaming.engine.metric_totals import BATCH_DURATION, BoardView, MetricsBoard

__all__ = ["serve_metrics", "serve_coordinator", "watch_lag", "MetricsServer", "BoardCollector",
           "MetricsSources", "DRIVER_HELP", "HISTOGRAM_HELP", "driver_heap"]

# The driver's own counters (the keys' are Counted's). Prometheus appends _total.
DRIVER_HELP: dict[str, str] = {
    "batches": "micro-batches completed",
    "input_rows": "records read from the half and end topics",
}

HISTOGRAM_HELP: dict[str, str] = {**Timed.HELP, BATCH_DURATION: "duration of a micro-batch"}

_BOUNDS_S = [f"{ms / 1000:g}" for ms in BUCKETS_MS] + ["+Inf"]


def driver_heap(spark: Any) -> Callable[[], tuple[int, int]]:
    """(used, max) bytes of the driver JVM's heap, read over py4j at each call."""
    def read() -> tuple[int, int]:
        runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        return int(runtime.totalMemory()) - int(runtime.freeMemory()), int(runtime.maxMemory())
    return read


@dataclass
class MetricsSources:
    """What a coordinator's ``/metrics`` and ``/healthz`` read; any of them may be absent."""

    board: MetricsBoard | None = None
    lag: LagWatch | None = None
    heap: Callable[[], tuple[int, int]] | None = None
    health: HealthCheck | None = None
    restarts: Callable[[], int] | None = None  # the query's restarts after a broker outage


class BoardCollector(Collector):
    """The labelled counters, histograms and gauges of a :class:`MetricsBoard`, the lag and
    the heap. Every family is listed at every scrape, with or without samples yet."""

    def __init__(self, sources: MetricsSources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        board = self.sources.board
        view = board.view() if board is not None else None
        yield from self._counters(view)
        yield from self._histograms(view)
        yield from self._open(view)
        reading = self.sources.lag.reading() if self.sources.lag is not None else None
        yield from self._lag(reading)
        yield from self._broker(reading)
        yield from self._heap()

    def _counters(self, view: BoardView | None) -> Iterable[Metric]:
        for name, text in Counted.HELP.items():
            labels = Counted.LABELS[name]
            family = CounterMetricFamily(f"txstream_{name}", text, labels=labels)
            samples = [(list(values), float(n)) for (metric, values), n
                       in (view.counters.items() if view else ()) if metric == name]
            if not labels and not samples:
                samples = [([], 0.0)]  # a counter without labels is there from the start
            for values, n in samples:
                family.add_metric(values, n)
            yield family
        driver = {"batches": view.batches, "input_rows": view.input_rows} if view else {}
        for name, text in DRIVER_HELP.items():
            yield CounterMetricFamily(f"txstream_{name}", text, value=float(driver.get(name, 0)))

    def _histograms(self, view: BoardView | None) -> Iterable[Metric]:
        for name, text in HISTOGRAM_HELP.items():
            counts = view.histograms.get(name) if view else None
            counts = counts or [0] * (len(BUCKETS_MS) + 2)
            cumulative, running = [], 0
            for bound, n in zip(_BOUNDS_S, counts[:-1], strict=True):
                running += n
                cumulative.append((bound, float(running)))
            yield HistogramMetricFamily(f"txstream_{name}_seconds", text, buckets=cumulative,
                                        sum_value=counts[-1] / 1000)

    def _open(self, view: BoardView | None) -> Iterable[Metric]:
        if view is None or not view.open_known:
            return  # not known until the state was read: absent, not zero
        pending = GaugeMetricFamily(
            "txstream_pending_transactions",
            "unresolved transactions held, by status (pending, committed waiting for its "
            "release, held end event) and producer group", labels=("status", "producer_group"))
        for (status, group), n in sorted(view.open_counts.items()):
            pending.add_metric([status, group], float(n))
        yield pending
        age = 0.0 if view.oldest_born is None else max(0.0, time.time() - view.oldest_born / 1000)
        yield GaugeMetricFamily("txstream_oldest_pending_age_seconds",
                                "age of the oldest pending half message (0: none)", value=age)

    def _lag(self, reading: LagReading | None) -> Iterable[Metric]:
        lag = reading.lag if reading is not None else None
        if lag is None:
            return
        family = GaugeMetricFamily(
            "txstream_input_lag_records", "records of an input partition not yet read by a "
            "completed micro-batch", labels=("topic", "partition"))
        for (topic, partition), n in sorted(lag.items()):
            family.add_metric([topic, str(partition)], float(n))
        yield family

    def _broker(self, reading: LagReading | None) -> Iterable[Metric]:
        if self.sources.restarts is not None:
            yield CounterMetricFamily(
                "txstream_query_restarts", "restarts of the query from its checkpoint after a "
                "failure the broker caused (--broker-outage-limit)",
                value=float(self.sources.restarts()))
        if reading is None:
            return
        away = reading.away
        yield GaugeMetricFamily("txstream_broker_unreachable_seconds",
                                "how long the broker has not answered the driver (0: it answers)",
                                value=0.0 if away is None else round(away[0], 3))

    def _heap(self) -> Iterable[Metric]:
        if self.sources.heap is None:
            return
        try:
            used, most = self.sources.heap()
        except Exception:  # py4j: the JVM is gone; /healthz says so
            return
        yield GaugeMetricFamily("txstream_driver_heap_used_bytes",
                                "the Spark driver JVM's heap in use", value=float(used))
        yield GaugeMetricFamily("txstream_driver_heap_max_bytes",
                                "the Spark driver JVM's largest heap (-Xmx)", value=float(most))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # not a line per scrape


def _app(registry: CollectorRegistry, health: HealthCheck | None) -> Callable[..., Any]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if health is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"no health check\n"]
        healthy, body = health.check()
        start_response("200 OK" if healthy else "503 Service Unavailable",
                       [("Content-Type", "application/json")])
        return [json.dumps(body).encode("utf-8") + b"\n"]
    return app


class MetricsServer:
    """The HTTP server behind ``/metrics`` and ``/healthz``; ``close()`` frees the port."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self._also: list[Callable[[], None]] = []

    def on_close(self, close: Callable[[], None]) -> None:
        """Call ``close`` too when the server closes."""
        self._also.append(close)

    @property
    def port(self) -> int:
        return int(self._httpd.server_port)

    @property
    def host(self) -> str:
        """The address bound (0.0.0.0: every interface)."""
        return str(self._httpd.server_address[0])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        for close in self._also:
            close()


def serve_metrics(port: int, sources: MetricsSources | MetricsBoard,
                  host: str = "0.0.0.0") -> MetricsServer:
    """Serve ``/metrics`` (and ``/healthz`` when given a health check) on ``HOST:PORT`` from a
    daemon thread. ``host`` defaults to all interfaces (a scraper in another container must
    reach it); ``port=0`` picks a free port (see ``MetricsServer.port``)."""
    if isinstance(sources, MetricsBoard):
        sources = MetricsSources(sources)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(BoardCollector(sources))
    # The process's CPU, memory and open files, as the default registry would have them.
    registry.register(ProcessCollector(registry=None))
    httpd = make_server(host, port, _app(registry, sources.health), ThreadingWSGIServer,
                        handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="txstream-metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


def watch_lag(coordinator: Any, thresholds: HealthThresholds | None = None) -> LagWatch:
    """A started :class:`LagWatch` of ``coordinator``'s input topics (and so of its broker)."""
    config = coordinator.config
    window_s = (thresholds or HealthThresholds()).lag_growing_s
    board = coordinator.listener.board
    topics = config.topics
    # The half topic too: a partition of it short of replicas holds bodies back (0021).
    own = [topics.half, topics.history, topics.discard, topics.dead_letter]

    def writes_to() -> list[str]:
        # The real topics it released to (the commits counter's labels), and its own.
        counters = board.view().counters
        return own + sorted({labels[1] for (name, labels) in counters
                             if name == Counted.COMMITS and len(labels) > 1})

    return LagWatch(config.kafka, [topics.half, topics.end], board, window_s=window_s,
                    writes_to=writes_to).start()


def serve_coordinator(coordinator: Any, thresholds: HealthThresholds | None = None,
                      port: int | None = None, host: str | None = None, *,
                      lag: LagWatch | None = None,
                      problem: Callable[[], str | None] | None = None,
                      stopping: Callable[[], bool] | None = None,
                      restarts: Callable[[], int] | None = None) -> MetricsServer:
    """``/metrics`` and ``/healthz`` of a started :class:`~streaming.engine.coordinator.
    Coordinator`, its input lag watched (by ``lag``, else a watch of the server's own, stopped
    when it closes); ``port``/``host`` default to its config's. ``problem`` (default: the
    query's), ``stopping`` and ``restarts`` feed the health check and the metrics."""
    from txstream.streaming.engine.timers import schedule_file

    config = coordinator.config
    thresholds = thresholds or HealthThresholds()
    board = coordinator.listener.board
    own = lag is None
    watch = watch_lag(coordinator, thresholds) if lag is None else lag
    health = HealthCheck(problem or (lambda: query_problem(coordinator)), board, watch,
                         schedule_file(str(config.checkpoint_dir)), thresholds, stopping)
    sources = MetricsSources(board, watch, driver_heap(coordinator.spark), health, restarts)
    try:
        server = serve_metrics(config.metrics_port if port is None else port, sources,
                               config.metrics_host if host is None else host)
    except BaseException:
        if own:
            watch.close()
        raise
    if own:
        server.on_close(watch.close)
    return server
