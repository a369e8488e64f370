"""A warm Python process, which forks Spark's Python processes with everything imported.

A local driver that txstream starts (:func:`txstream.streaming.engine.session.build_session`)
starts one (:func:`start_warm_python`) beside its JVM, and gives the JVM a launcher for its
Python (``PYSPARK_PYTHON``, ``PYSPARK_DRIVER_PYTHON``). The warm process imports pyspark's
daemon, worker and runner modules, pandas, pyarrow and txstream's source, operator and sink
once. The launcher hands every ``python -m pyspark.<module>`` to
:mod:`txstream.streaming.engine.warm_fork`, which asks the warm process for a fork running that
module with the requester's standard streams, environment, arguments and directory; anything
else runs this interpreter as before. Each of a cold coordinator's Python processes then starts
in milliseconds, not in a second of imports (decision 0035).

It ends when the driver's end of its stdin closes (the driver exited, however). The processes
it forked do not depend on it: each ends as Spark's own would.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import runpy
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

from txstream.streaming.engine import warm_fork
from txstream.streaming.engine.local_fs import txstream_cache
from txstream.streaming.engine.warm_fork import DAEMON, WARM_PYTHON_ENV

__all__ = ["PRELOADED", "WARM_PYTHON_OFF_ENV", "cold_python", "start_warm_python", "serve"]

WARM_PYTHON_OFF_ENV = "TXSTREAM_COLD_PYTHON"  # set to 1: Spark's Python starts as Spark's own

# What Spark's Python processes would otherwise import, each for itself.
PRELOADED = (
    "pyspark.daemon", "pyspark.worker",
    "pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read", "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.python_streaming_sink_runner",
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pandas", "pyarrow",
    "txstream.sources.kafka_source", "txstream.sinks.kafka_sink",
    "txstream.streaming.engine.operator",
)

_LAUNCHER_ENV = "TXSTREAM_WARM_LAUNCHER"
# Spark's Python for tasks, and for the driver's planning (its data source lookup).
_PYTHONS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
# Spark's Python modules go to the warm process; any other use of Python is this interpreter.
_LAUNCHER = """#!/bin/sh
if [ "$1" = -m ] && [ -S "$TXSTREAM_WARM_PYTHON" ]; then
  case "$2" in pyspark.*) shift; exec {python} -I -S {shim} "$@";; esac
fi
exec {python} "$@"
"""

_started: dict[str, Any] = {}


def start_warm_python() -> str | None:
    """Start this driver's warm process (once), and make its launcher the ``PYSPARK_PYTHON``
    of the JVM about to start; the launcher's path, or None where Python stays as it was
    (turned off, another interpreter chosen by the user, or no launcher that may run)."""
    cold_python()
    chosen = {os.environ.get(name, sys.executable) for name in _PYTHONS}
    if os.environ.get(WARM_PYTHON_OFF_ENV, "") not in ("", "0") or chosen != {sys.executable}:
        return None
    launcher = _launcher()
    if launcher is None:
        return None
    proc = _started.get("proc")
    if proc is None or proc.poll() is not None:
        path = os.path.join(tempfile.mkdtemp(prefix="txstream-warm-"), "forks.sock")
        # One BLAS thread: a process forked while a thread runs gets only the forking one.
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        _started["proc"] = subprocess.Popen(
            [sys.executable, "-m", __name__, path], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, env=env, start_new_session=True)  # no Ctrl-C of ours
        _started["path"] = path
    os.environ[WARM_PYTHON_ENV] = _started["path"]
    os.environ[_LAUNCHER_ENV] = launcher
    os.environ.update(dict.fromkeys(_PYTHONS, launcher))
    return launcher


def _launcher(cache: Path | None = None) -> str | None:
    """The launcher for this interpreter, in txstream's cache: kept there, so that a process
    that inherited it (a spark-submit started by a driver) still runs Python once that driver
    and its warm process are gone. None when it cannot be written or run (a cache mounted
    ``noexec``)."""
    text = _LAUNCHER.format(python=shlex.quote(sys.executable),
                            shim=shlex.quote(warm_fork.__file__))
    folder = cache or txstream_cache()
    path = folder / f"python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    try:
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            made = folder / f".{path.name}.{os.getpid()}"
            made.write_text(text)
            made.chmod(0o755)
            made.replace(path)  # whole, or not there: another driver may be starting too
    except OSError:
        return None
    return str(path) if os.access(path, os.X_OK) else None


def cold_python() -> None:
    """Spark's Python as it was: a launcher this process inherited (a coordinator started by
    one that runs Spark) is its parent's, whose warm process may end before this one."""
    launcher = os.environ.pop(_LAUNCHER_ENV, None)
    os.environ.pop(WARM_PYTHON_ENV, None)
    for name in _PYTHONS:
        if launcher is not None and os.environ.get(name) == launcher:
            os.environ[name] = sys.executable


def serve(path: str) -> None:
    """The warm process: listen at ``path``, import, then fork until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its forks are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # first: a request made during the imports waits for them
    listener.listen(64)
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception:  # a module missing here is imported by its fork, as before
            pass
    try:
        while True:
            ready = select.select([0, listener.fileno()], [], [])[0]
            if 0 in ready and not os.read(0, 4096):
                return  # the driver is gone
            if listener.fileno() in ready:
                conn, _ = listener.accept()
                _fork(conn, listener)
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < 4 or len(fds) != 3:
        raise OSError("not a launcher's request")
    size = struct.unpack("!I", data[:4])[0]
    body = data[4:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise OSError("a request cut short")
        body += chunk
    return json.loads(body), fds


def _fork(conn: socket.socket, listener: socket.socket) -> None:
    fds: list[int] = []
    try:
        request, fds = _request(conn)
        if request["executable"] != sys.executable:
            conn.sendall(struct.pack("!i", -1))  # another interpreter: it starts its own
            return
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            _run_module(conn, listener, request, fds)  # never returns
    except OSError:
        pass
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """The requester's standard streams, directory, environment and ``sys.path``."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # As ``python -m`` would have it: the JVM's PYTHONPATH (pyspark, py4j, --py-files) before
    # this interpreter's own.
    given = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [*dict.fromkeys(given), *(p for p in sys.path if p not in given)]


def _run_module(conn: socket.socket, listener: socket.socket, request: dict[str, Any],
                fds: list[int]) -> None:
    """In the fork: ``python -m`` the requested module, and send its exit code back (a
    daemon's forks would share the connection: a daemon closes it first)."""
    code = 1
    answer: socket.socket | None = conn
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _become(request, fds)
        module, *args = request["argv"]
        conn.sendall(struct.pack("!i", os.getpid()))
        if module == DAEMON:
            conn.close()
            answer = None
        sys.argv = [module, *args]
        # The module was imported here on purpose: runpy's warning that it was is noise.
        warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package",
                                RuntimeWarning)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:  # as the interpreter ends: a message is printed, then 1
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            if answer is not None:
                answer.sendall(struct.pack("!i", code))
        finally:
            os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1])
