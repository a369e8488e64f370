"""The running console: its index, the thread that feeds it and the web server, together.

The web server is Werkzeug's threaded one (Flask's own): a console serves a few operators on
a trusted network, bound to loopback by default; each request is a few SQLite queries.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from txstream.console.feed import Feeder, IndexFeed
from txstream.console.index import Index
from txstream.console.release_lookup import find_releases
from txstream.console.web import ExtraPage, Resolver, create_app
from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings
from txstream.topics import Topics

__all__ = ["ConsoleServer", "default_index_path"]


def default_index_path(topics: Topics) -> Path:
    """``$XDG_DATA_HOME/txstream/console-<prefix>.sqlite`` (``~/.local/share`` without it): one
    file per coordinator (topic prefix), kept between runs; ``./txstream-console.sqlite``
    where there is no home to keep it in."""
    try:
        home: Path | None = Path.home()
    except RuntimeError:  # no HOME, no passwd entry (containers)
        home = None
    base = os.environ.get("XDG_DATA_HOME") or (
        str(home / ".local" / "share") if home is not None and home.is_dir() else "")
    if not base:
        return Path("txstream-console.sqlite")
    name = f"console-{topics.prefix}.sqlite" if topics.prefix else "console.sqlite"
    return Path(base) / "txstream" / name


class ConsoleServer:
    """The console on ``host``:``port`` (0: a free one), over the index at ``index_path``;
    ``extra``: pages of the program that runs it (:class:`txstream.console.web.ExtraPage`)."""

    def __init__(self, index_path: str | Path, settings: KafkaSettings, topics: Topics, *,
                 host: str = "127.0.0.1", port: int = 8080, admin_token: str | None = None,
                 resolver: Resolver | None = None, operator: str = "console",
                 interval_s: float = 0.5,
                 extra: Mapping[str, Callable[[], ExtraPage]] | None = None) -> None:
        from werkzeug.serving import make_server

        self.index = Index(index_path)
        try:
            self.index.bind("history_topic", topics.history)  # the wrong file: say so now
        except ConfigError:
            self.index.close()
            raise
        self.feeder = Feeder(lambda: IndexFeed(self.index, settings, topics), interval_s)
        self.app = create_app(self.index, status=lambda: self.feeder.status,
                              resolver=resolver, admin_token=admin_token,
                              default_operator=operator,
                              locate=functools.partial(find_releases, settings),
                              extra=extra)
        try:
            self._http: Any = make_server(host, port, self.app, threaded=True)
        except OSError as exc:
            self.index.close()
            raise ConfigError(f"the console cannot listen on {host}:{port}: {exc}") from None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host if ':' not in host else f'[{host}]'}:{port}"

    def start(self) -> ConsoleServer:
        """Feed the index and serve, both from threads of their own."""
        self.feeder.start()
        self._thread = threading.Thread(target=self._http.serve_forever,
                                        name="txstream-console-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Feed the index from a thread and serve from this one, until interrupted."""
        self.feeder.start()
        self._http.serve_forever()

    def close(self) -> None:
        if self._thread is not None:  # serve_forever() on the caller's thread has ended already
            self._http.shutdown()
        self._http.server_close()
        # A round stuck on an unreachable broker may outlast this: the thread is a daemon,
        # and a commit it makes later is whole (the index's connection closes after it).
        self.feeder.stop(timeout_s=5.0)
        self.index.close()

    def __enter__(self) -> ConsoleServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
