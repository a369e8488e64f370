"""What Spark's ``python -m pyspark.<module>`` runs on a local driver txstream started: the
warm process's launcher (:mod:`txstream.streaming.engine.warm_python`) runs this file instead,
by its path, without ``site``.

Spark starts its Python one process at a time, each the first time it needs it: a daemon per
kind of work (the data source lookup, ``create_data_source``, the read and write planners,
the commit runner, the task workers) and the streaming source's runner. Each starts cold and
imports pyspark, pandas, pyarrow and txstream for itself: about a second each, most of a fresh
coordinator's first batch (decision 0035).

Here the process asks the warm process (named by ``TXSTREAM_WARM_PYTHON``) to fork the module
for it, with these standard streams, this environment and these arguments; the fork has all of
it imported already. This process then only stands for the fork to the JVM: a SIGTERM is
passed on, and it exits when the fork does, with its code. When the warm process does not
answer, it becomes ``python -m <module>`` itself, as Spark asked.

Only the standard library is imported here: this file's own start is on the path it cuts.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import time

__all__ = ["WARM_PYTHON_ENV", "DAEMON", "main"]

WARM_PYTHON_ENV = "TXSTREAM_WARM_PYTHON"
DAEMON = "pyspark.daemon"
_CONNECT_TIMEOUT_S = 60.0  # the warm process answers once its imports are done


def _ask(path: str, argv: list[str]) -> tuple[socket.socket, int] | None:
    """The fork of ``python -m argv...`` made for this process by the warm process at
    ``path``, and the connection its exit code comes back on; None when there is none to ask
    (then nothing was written to stdout)."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(_CONNECT_TIMEOUT_S)
        conn.connect(path)
        request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                              "executable": sys.executable}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        pid = _read_int(conn)
    except OSError:
        return None
    return (conn, pid) if pid is not None and pid > 0 else None


def _read_int(conn: socket.socket) -> int | None:
    answer = b""
    while len(answer) < 4:
        chunk = conn.recv(4 - len(answer))
        if not chunk:
            return None
        answer += chunk
    value: int = struct.unpack("!i", answer)[0]
    return value


def _wait_gone(pid: int) -> None:
    """Return once ``pid`` (not this process's child) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    while True:
        if fd is not None:
            if select.select([fd], [], [], 1.0)[0]:
                return
            continue
        try:  # no pidfd (a kernel before 5.3): look once a second
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(1.0)


def _stand_for(conn: socket.socket, pid: int, daemon: bool) -> int:
    """Pass a SIGTERM on to the fork; its exit code once it has exited. A daemon's forks
    share its connection, so a daemon is waited for by its pid and exits 0, as Spark's does."""
    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    if daemon:
        _wait_gone(pid)
        return 0
    conn.settimeout(None)
    try:
        code = _read_int(conn)
    except OSError:
        code = None
    return 1 if code is None else code


def main() -> None:
    argv = sys.argv[1:]
    path = os.environ.get(WARM_PYTHON_ENV)
    fork = _ask(path, argv) if path and argv else None
    if fork is None:
        os.execv(sys.executable, [sys.executable, "-m", *argv])
    conn, pid = fork
    sys.exit(_stand_for(conn, pid, argv[0] == DAEMON))


if __name__ == "__main__":
    main()
