"""Ports for what the tests start (brokers, metrics endpoints, Spark UIs, a standalone cluster).

Each xdist worker takes ports from a range of its own, below the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``: 32768 and up here): two workers never pick the same
port, and no outgoing connection can hold one between its pick and its use.
"""

from __future__ import annotations

import itertools
import os
import socket

__all__ = ["reserve_port"]

_BASE, _SPAN = 20000, 2000
_picks = itertools.count()


def _worker() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ...
    return int(name.removeprefix("gw") or 0)


def reserve_port() -> int:
    """A port free now, in this worker's range (each port once per run, as long as it lasts)."""
    start = _BASE + _worker() * _SPAN
    for _ in range(_SPAN):
        port = start + next(_picks) % _SPAN
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken, or a closed connection's TIME_WAIT
            return port
    raise RuntimeError(f"no free port in {start}-{start + _SPAN - 1}")
