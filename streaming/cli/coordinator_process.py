"""A coordinator as a process tree: ``txstream run`` started in a session of its own, stopped
cleanly or SIGKILLed whole, and what its checkpoint on local disk says of its micro-batches.

A SIGKILL of the driver alone is not a crash of the job: pyspark's daemons put themselves in a
process group of their own (``os.setpgid(0, 0)`` in ``pyspark.daemon``), so they and their
Python workers would live on. :meth:`CoordinatorProcess.kill` takes every descendant first,
then kills the driver's process group (the JVM is in it) and every descendant with SIGKILL.
:meth:`CoordinatorProcess.freeze` stops the same tree with SIGSTOP, so a caller can look at the
checkpoint while nothing can change it, then kill or thaw it.

``txstream demo --recovery`` crashes its coordinator this way; the fault tests do too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from txstream.errors import TxStreamError

__all__ = ["descendants", "alive", "CoordinatorProcess", "LOCAL_RUN", "KillFailed",
           "batch_ids", "in_flight_batch"]


class KillFailed(TxStreamError):
    """Processes of a coordinator's tree outlived its SIGKILL."""


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue  # gone meanwhile
        # The command name is in parentheses and may hold spaces: the ppid follows the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    tree = _children_map()
    out: list[int] = []
    todo = list(tree.get(pid, ()))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(tree.get(child, ()))
    return out


def _state(pid: int) -> str | None:
    """``pid``'s state letter (R, S, T, Z, ...), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited: its parent only did not reap it yet)."""
    return _state(pid) not in (None, "Z")


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def batch_ids(checkpoint: Path, log: str) -> set[int]:
    """Batch ids in the checkpoint's ``offsets`` (planned) or ``commits`` (done) log."""
    folder = checkpoint / log
    if not folder.is_dir():
        return set()
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()}


def in_flight_batch(checkpoint: Path) -> int | None:
    """The batch that is planned but not committed, if one is running now: Spark writes
    ``offsets/N`` before it runs batch N and ``commits/N`` once its sink is done."""
    planned, done = batch_ids(checkpoint, "offsets"), batch_ids(checkpoint, "commits")
    pending = planned - done
    return max(pending) if pending else None


# ``txstream run`` by this interpreter (its venv's txstream), without Spark's web UI.
LOCAL_RUN = (sys.executable, "-m", "txstream.streaming.cli", "run", "--conf",
             "spark.ui.enabled=false")


class CoordinatorProcess:
    """One coordinator process tree (``python -m txstream.streaming.cli run``, or ``command``:
    a spark-submit of it), its output in ``log_path``; ``cwd`` and ``env`` (added to ours) as a
    user on another host would have them."""

    def __init__(self, args: Sequence[str], log_path: Path, command: Sequence[str] = LOCAL_RUN,
                 cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.args = [*command, *args]
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self._frozen: list[int] = []

    def start(self) -> CoordinatorProcess:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
               **self.env}
        self.started_at = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches the JVM too
            )
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def freeze(self) -> None:
        """SIGSTOP the whole tree: nothing in it writes a file or a record until :meth:`thaw`
        or :meth:`kill` (a request already on the wire may still land)."""
        proc = self.proc
        assert proc is not None
        self._frozen = [proc.pid, *descendants(proc.pid)]
        _signal_all(self._frozen, signal.SIGSTOP)
        # A signal is delivered when the process is next scheduled: wait until all stand still.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(
                _state(p) not in (None, "Z", "T", "t") for p in self._frozen):
            time.sleep(0.001)

    def thaw(self) -> None:
        """SIGCONT what :meth:`freeze` stopped."""
        _signal_all(self._frozen, signal.SIGCONT)
        self._frozen = []

    def kill(self) -> int:
        """SIGKILL the whole tree at once, as a power cut would; returns how many processes."""
        proc = self.proc
        assert proc is not None
        tree = sorted({*descendants(proc.pid), *self._frozen} - {proc.pid})
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _signal_all(tree, signal.SIGKILL)
        self._frozen = []
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in tree if alive(p)]
        if left:
            raise KillFailed(f"processes survived SIGKILL: {left}")
        return 1 + len(tree)

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (a clean stop), then kill whatever is left after ``timeout_s``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc else None
        if self._frozen:
            self.thaw()  # a stopped JVM would not hear the SIGTERM
        tree = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        # What the clean stop left behind (Spark's daemons go once the JVM is gone) must not
        # outlive the command either.
        _signal_all([p for p in tree if alive(p)], signal.SIGKILL)
        return code

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
