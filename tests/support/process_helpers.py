"""Coordinator processes for the fault tests: start ``txstream run``, kill it like a crash.

The process tree and the checkpoint's batches are the product's
(:mod:`txstream.streaming.cli.coordinator_process`, which ``txstream demo --recovery`` uses):
here a coordinator runs from the repository, as the tests start it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from txstream.streaming.cli import coordinator_process
from txstream.streaming.cli.coordinator_process import (
    LOCAL_RUN,
    batch_ids,
    descendants,
    in_flight_batch,
)

__all__ = ["descendants", "CoordinatorProcess", "SHADOWED", "application_directory", "S3Server",
           "batch_ids", "in_flight_batch", "script_process", "pause", "REPO", "marked_processes"]

REPO = Path(__file__).resolve().parents[2]


# Names an application may well have for modules of its own (decision 0025).
SHADOWED = ("client", "state", "console", "sources", "sinks", "streaming")


def application_directory(path: Path) -> Path:
    """An application's directory, first on its path: modules named as txstream's rooms."""
    path.mkdir(parents=True, exist_ok=True)
    for name in SHADOWED:
        (path / f"{name}.py").write_text(f"OWN = {name!r}\n")
    return path


class CoordinatorProcess(coordinator_process.CoordinatorProcess):
    """The product's coordinator process tree, run from the repository unless told otherwise."""

    def __init__(self, args: Sequence[str], log_path: Path, command: Sequence[str] = LOCAL_RUN,
                 cwd: Path = REPO, env: dict[str, str] | None = None) -> None:
        super().__init__(args, log_path, command=command, cwd=cwd, env=env)


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
        from tests.support.ports import reserve_port

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


def marked_processes(variable: str, mark: str) -> list[str]:
    """``pid: command line`` of the live processes whose environment has ``variable=mark``
    (a zombie has exited; its parent just did not reap it yet): what a test started and
    must have stopped."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"{variable}={mark}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid}: {cmdline[:200]}")
        except OSError:
            continue
    return found
