"""Coordinator processes for the fault tests: start ``txstream run``, kill it like a crash.

A SIGKILL of the driver alone is not a crash of the job: pyspark's daemons put themselves in a
process group of their own (``os.setpgid(0, 0)`` in ``pyspark.daemon``), so they and their
Python workers would live on. :meth:`CoordinatorProcess.kill` takes every descendant first,
then kills the driver's process group (the JVM is in it) and every descendant with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["descendants", "CoordinatorProcess", "SHADOWED", "application_directory", "S3Server",
           "batch_ids", "in_flight_batch", "script_process", "pause"]

REPO = Path(__file__).resolve().parent.parent


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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def batch_ids(checkpoint: Path, log: str) -> set[int]:
    """Batch ids in the checkpoint's ``offsets`` (planned) or ``commits`` (done) log."""
    folder = checkpoint / log
    if not folder.is_dir():
        return set()
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()}


def in_flight_batch(checkpoint: Path) -> int | None:
    """The batch that is planned but not committed, if one is running now."""
    planned, done = batch_ids(checkpoint, "offsets"), batch_ids(checkpoint, "commits")
    pending = planned - done
    return max(pending) if pending else None


# Names an application may well have for modules of its own (decision 0025).
SHADOWED = ("client", "state", "console", "sources", "sinks", "streaming")


def application_directory(path: Path) -> Path:
    """An application's directory, first on its path: modules named as txstream's rooms."""
    path.mkdir(parents=True, exist_ok=True)
    for name in SHADOWED:
        (path / f"{name}.py").write_text(f"OWN = {name!r}\n")
    return path


LOCAL_RUN = (sys.executable, "-m", "txstream.streaming.cli", "run", "--conf",
             "spark.ui.enabled=false")


class CoordinatorProcess:
    """One coordinator process tree (``python -m txstream.streaming.cli run``, or ``command``: a
    spark-submit of it), its output in ``log_path``; ``cwd`` and ``env`` (added to ours) as a
    user on another host would have them."""

    def __init__(self, args: Sequence[str], log_path: Path, command: Sequence[str] = LOCAL_RUN,
                 cwd: Path = REPO, env: dict[str, str] | None = None) -> None:
        self.args = [*command, *args]
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

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

    def kill(self) -> int:
        """SIGKILL the whole tree at once, as a power cut would; returns how many processes."""
        proc = self.proc
        assert proc is not None
        tree = descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in tree if _alive(p)]
        assert not left, f"processes survived SIGKILL: {left}"
        return 1 + len(tree)

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (a clean stop), then kill whatever is left after ``timeout_s``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc else None
        tree = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        # What the clean stop left behind (Spark's daemons go once the JVM is gone) must not
        # outlive the test either.
        for pid in tree:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return code

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def script_process(script: Path, args: Sequence[str], log_path: Path,
                   env: dict[str, str] | None = None) -> CoordinatorProcess:
    """Any Python script of the repository (a client process of a fault test), in a process
    tree killed and stopped as a coordinator's is; the repository is on its path."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return CoordinatorProcess(args, log_path, command=(sys.executable, str(script)),
                              env={"PYTHONPATH": path, **(env or {})})


def pause(pid: int, seconds: float) -> None:
    """SIGSTOP ``pid`` for ``seconds``, then SIGCONT: a process that hangs (a broker stalled on
    its disk, a long pause of its runtime) and comes back as it was, connections and all."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


class S3Server:
    """``moto_server`` (PyPI ``moto[server]``) on loopback: an S3 endpoint for tansu's
    ``s3://`` storage, so a broker restart keeps its data."""

    def __init__(self, log_path: Path) -> None:
        from ports import reserve_port

        self.port = reserve_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def broker_env(self) -> dict[str, str]:
        """What tansu needs to store in this S3 (any credentials: moto checks none)."""
        return {"AWS_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": "txstream",
                "AWS_SECRET_ACCESS_KEY": "txstream", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true"}

    def start(self, bucket: str, timeout_s: float = 60.0) -> S3Server:
        import boto3

        server = Path(sys.executable).with_name("moto_server")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        env = self.broker_env()
        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                s3.create_bucket(Bucket=bucket)
                return self
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
