"""One node of an Apache Kafka cluster started by txstream: its files, its JVM, its log.

The jars come from Maven Central through ``deploy/kafka/pom.xml``; ``scripts/setup.sh`` copies
them into ``<venv>/kafka/libs``. A node runs KRaft in combined mode (broker and controller in
one JVM) on loopback ports. :class:`txstream.kafka_broker.KafkaBroker` puts nodes together.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from txstream.class_data import sharing_options
from txstream.errors import BrokerUnavailable

__all__ = ["KafkaNode", "kafka_libs", "class_archive", "check_installed", "SETUP_HINT",
           "JVM_OPTIONS"]

SETUP_HINT = "run scripts/setup.sh (or make setup)"
# A test broker never runs long enough for C2 to pay: with C1 alone a node started in 8.5 s,
# not 14.5 (2 busy cores, no class archive). Serial GC: no collector threads to compete.
JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")
_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
# WARN and above, to a file of the node's own: a broker at INFO writes several lines a second.
_LOG4J2 = """\
status = error
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
logger.state.name = state.change.logger
logger.state.level = ERROR
"""


def kafka_libs() -> Path:
    """Where the set-up put the jars: ``TXSTREAM_KAFKA_LIBS``, else ``<venv>/kafka/libs``."""
    given = os.environ.get("TXSTREAM_KAFKA_LIBS")
    return Path(given) if given else Path(sys.prefix) / "kafka" / "libs"


def class_archive(libs: Path) -> Path:
    """The class-data archive (AppCDS) the set-up writes beside the jars: a JVM that maps it
    loads Kafka's and Scala's classes already parsed, and starts seconds sooner. A JVM that
    does not match it (Java updated since) ignores it."""
    return libs.parent / "classes.jsa"


def check_installed(libs: Path, java: str) -> str:
    """The java executable's path, once it and Kafka's jars are there; else BrokerUnavailable."""
    found = shutil.which(java)
    if found is None:
        raise BrokerUnavailable(f"Apache Kafka needs Java 17+: no {java!r} found; {SETUP_HINT}")
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise BrokerUnavailable(f"Apache Kafka's jars are not in {libs}; {SETUP_HINT}")
    return found


class KafkaNode:
    """One KRaft node (``process.roles=broker,controller``) in a directory of its own."""

    def __init__(self, node_id: int, port: int, controller_port: int, directory: Path,
                 java: str, libs: Path, jvm_options: tuple[str, ...] = JVM_OPTIONS) -> None:
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.directory = directory
        self.java = java
        self.libs = libs
        self.jvm_options = jvm_options
        self.proc: subprocess.Popen[bytes] | None = None
        self._terminated = False

    @property
    def config_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def stdout_path(self) -> Path:
        return self.directory / "stdout.log"

    def write_config(self, properties: Mapping[str, str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in properties.items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.directory / "log4j2.properties").write_text(_LOG4J2.format(path=self.log_path))

    def _command(self, main: str, *args: str, archive_to: Path | None = None) -> list[str]:
        log4j = self.directory / "log4j2.properties"
        sharing = sharing_options(class_archive(self.libs), archive_to)
        return [self.java, *self.jvm_options, *sharing, f"-Dlog4j2.configurationFile={log4j}",
                "-cp", f"{self.libs}/*", main, *args]

    def format_storage(self, cluster_id: str) -> subprocess.Popen[bytes]:
        """Starts ``kafka-storage format``; the caller waits (nodes format side by side)."""
        with open(self.stdout_path, "ab") as out:
            return subprocess.Popen(
                self._command(_STORAGE_TOOL, "format", "--cluster-id", cluster_id,
                              "--config", str(self.config_path), "--ignore-formatted"),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def start(self, archive_to: Path | None = None) -> None:
        """Starts the JVM; ``archive_to``: write the classes it loaded there when it exits."""
        with open(self.stdout_path, "ab") as out:
            self.proc = subprocess.Popen(
                self._command(_MAIN, str(self.config_path), archive_to=archive_to), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)  # Ctrl-C reaches us, and we stop it
        self._terminated = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, signum: int) -> None:
        if self.running and self.proc is not None:
            self.proc.send_signal(signum)

    def pause(self) -> None:
        """SIGSTOP, returning once the JVM is stopped (a signal arrives later than it is sent)."""
        self.signal(signal.SIGSTOP)
        self._await_state(stopped=True)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self._await_state(stopped=False)

    def _await_state(self, stopped: bool, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pid is not None and time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:  # gone, or no /proc here: nothing to wait for
                return
            if (state in ("t", "T")) == stopped:
                return
            time.sleep(0.01)

    def terminate(self) -> None:
        """Asks the JVM to stop (SIGTERM); :meth:`stop` waits for it."""
        if self.running and self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)  # a paused JVM cannot act on SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM unless :meth:`terminate` sent it, then SIGKILL past ``timeout_s``."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self.terminate()
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the node's output and log, for an error message."""
        parts = []
        for path in (self.stdout_path, self.log_path):
            try:
                text = path.read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                parts.append(f"{path.name}:\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts) or "(no output)"
