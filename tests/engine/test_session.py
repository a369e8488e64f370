"""The JVM txstream starts: its compilers and its local file system are what we chose."""

from __future__ import annotations

import os
import stat
import zipfile
from typing import Any

import pytest

from tests.support.kafka_helpers import wait_until
from tests.support.process_helpers import CoordinatorProcess, descendants
from txstream.broker import EmbeddedBroker
from txstream.errors import ConfigError
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.local_fs import NO_FORK_FS_CLASS, no_fork_fs_jar
from txstream.streaming.engine.session import build_session
from txstream.streaming.engine.spark_settings import (
    DEFAULT_DRIVER_MEMORY,
    JIT_OPTIONS,
    gc_options,
    with_no_fork_fs,
)


def _jvm_arguments(spark: Any) -> list[str]:
    bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    return list(bean.getInputArguments())


def _vm_option(spark: Any, name: str) -> str:
    """The JVM's own view of an option, not only an argument it was given."""
    jvm = spark.sparkContext._jvm
    hotspot = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(hotspot)
    return str(bean.getVMOption(name).getValue())


def test_the_session_runs_the_quick_compiler_only_by_default(spark: Any) -> None:
    assert JIT_OPTIONS["c1"] in _jvm_arguments(spark)
    assert _vm_option(spark, "TieredStopAtLevel") == "1"


def test_the_session_has_the_heap_it_was_given_not_sparks_1g(spark: Any) -> None:
    assert f"-Xmx{DEFAULT_DRIVER_MEMORY}" in _jvm_arguments(spark)
    heap_mib = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20
    assert heap_mib > 1536  # the JVM's own view; Spark's default would give ~1024


def test_the_session_gives_a_state_key_ordinary_g1_regions(spark: Any) -> None:
    # G1's own choice for the default 2g heap is 1 MB regions, which makes every copy of a
    # key of 512 KB or more humongous (docs/decisions/0008-driver-heap-and-g1-regions.md).
    assert int(_vm_option(spark, "G1HeapRegionSize")) == 4 * 2**20


@pytest.mark.parametrize(("heap", "option"), [
    ("512m", "-XX:G1HeapRegionSize=4m"),
    ("2g", "-XX:G1HeapRegionSize=4m"),
    ("7g", "-XX:G1HeapRegionSize=4m"),
    ("8g", ""),  # G1 picks 4 MB itself from here on, and more for bigger heaps: never lowered
    ("32768m", ""),
])
def test_g1_regions_are_raised_to_4m_never_lowered(heap: str, option: str) -> None:
    assert gc_options(heap) == option


def _driver_jvm_command_line(pid: int) -> list[str] | None:
    """The driver JVM's arguments; not those of Spark's launcher, a short-lived ``java`` that
    only builds the driver's command line (with a heap of its own, 128m)."""
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        if (argv[0].endswith("java") and "org.apache.spark.deploy.SparkSubmit" in argv
                and "org.apache.spark.launcher.Main" not in argv):
            return argv
    return None


def test_txstream_run_starts_its_jvm_with_the_driver_memory_asked_for(
        broker: EmbeddedBroker, tmp_path: Any) -> None:
    args = ["--bootstrap-servers", broker.bootstrap_servers, "--checkpoint-dir",
            str(tmp_path / "cp"), "--topic-prefix", f"{tmp_path.name}_", "--driver-memory",
            "1536m"]
    process = CoordinatorProcess(args, tmp_path / "run.log").start()
    try:
        assert process.proc is not None
        java = wait_until(lambda: _driver_jvm_command_line(process.proc.pid), timeout_s=90)
        assert "-Xmx1536m" in java, java
    finally:
        process.terminate()


def test_an_unknown_jit_is_refused_before_any_jvm_starts() -> None:
    with pytest.raises(ConfigError, match="jit"):
        RunConfig(jit="c2")
    with pytest.raises(ValueError, match="jit"):
        build_session(jit="c2")


def test_local_files_get_their_mode_from_the_no_fork_file_system(spark: Any, tmp_path) -> None:
    # Every checkpoint and state file is written through this class; a wrong mode bit would
    # leave a checkpoint another user (or the next run, under another umask) cannot read.
    jvm = spark.sparkContext._jvm
    hadoop = jvm.org.apache.hadoop.fs
    fs = hadoop.Path(tmp_path.as_uri()).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == NO_FORK_FS_CLASS
    for mode in (0o644, 0o600, 0o755, 0o751, 0o640, 0o777, 0o000):
        path = hadoop.Path((tmp_path / f"f{mode:o}").as_uri())
        fs.create(path, True).close()
        symbolic = stat.filemode(mode)[1:]  # "rw-r--r--"
        fs.setPermission(path, hadoop.permission.FsPermission.valueOf(f"-{symbolic}"))
        assert stat.S_IMODE(os.stat(tmp_path / f"f{mode:o}").st_mode) == mode
    made = hadoop.Path((tmp_path / "dir" / "sub").as_uri())
    assert fs.mkdirs(made)
    assert (tmp_path / "dir" / "sub").is_dir()


def test_the_no_fork_jar_is_built_once_and_skipped_without_javac(tmp_path, monkeypatch) -> None:
    jar = no_fork_fs_jar(tmp_path / "cache")
    assert jar is not None and jar.parent == tmp_path / "cache"
    with zipfile.ZipFile(jar) as built:
        assert "txstream/hadoop/NoForkLocalFileSystem$Raw.class" in built.namelist()
    built_at = jar.stat().st_mtime_ns
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert no_fork_fs_jar(tmp_path / "cache") == jar  # cached: no compiler needed again
    assert jar.stat().st_mtime_ns == built_at
    assert no_fork_fs_jar(tmp_path / "other") is None  # a JRE only: Hadoop's own class stays


def test_spark_settings_given_by_the_user_keep_their_class_path_and_file_system(tmp_path) -> None:
    jar = tmp_path / "no-fork.jar"
    assert with_no_fork_fs({}, jar) == {"spark.hadoop.fs.file.impl": NO_FORK_FS_CLASS,
                                        "spark.driver.extraClassPath": str(jar)}
    # The user's own jars stay on the class path, ours after them.
    mine = with_no_fork_fs({"spark.driver.extraClassPath": "/opt/jdbc.jar", "x": "1"}, jar)
    assert mine["spark.driver.extraClassPath"] == f"/opt/jdbc.jar{os.pathsep}{jar}"
    assert mine["x"] == "1" and mine["spark.hadoop.fs.file.impl"] == NO_FORK_FS_CLASS
    # A file system chosen by the user (to compare, docs/decisions/0006-no-fork-local-fs.md)
    # is not overridden.
    hadoop = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"}
    assert with_no_fork_fs(hadoop, jar)["spark.hadoop.fs.file.impl"] == \
        "org.apache.hadoop.fs.LocalFileSystem"


def test_txstream_run_honours_conf_flags_and_spark_defaults(
        broker: EmbeddedBroker, tmp_path: Any) -> None:
    from tests.support.cluster_helpers import ui_json
    from tests.support.ports import reserve_port

    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.executor.extraJavaOptions  -Dfrom.defaults=1\n"
        "spark.txstream.probe  defaults\nspark.txstream.kept  yes\n")
    ui = reserve_port()
    args = ["--bootstrap-servers", broker.bootstrap_servers, "--checkpoint-dir",
            str(tmp_path / "cp"), "--topic-prefix", f"{tmp_path.name}_",
            "--conf", "spark.ui.enabled=true", "--conf", f"spark.ui.port={ui}",
            "--conf", "spark.txstream.probe=flag"]
    process = CoordinatorProcess(args, tmp_path / "run.log",
                                 env={"SPARK_CONF_DIR": str(conf_dir)}).start()
    try:
        def environment() -> dict[str, str] | None:
            try:
                app = ui_json(ui, "applications")[0]["id"]
                return dict(ui_json(ui, f"applications/{app}/environment")["sparkProperties"])
            except (OSError, ValueError, IndexError, KeyError):  # not up yet
                return None

        properties = wait_until(environment, timeout_s=90)
        assert properties["spark.ui.enabled"] == "true"  # the UI answered at all
        assert properties["spark.txstream.probe"] == "flag"  # --conf beats the defaults file
        assert properties["spark.txstream.kept"] == "yes"
        # The user's JVM options stay, and txstream's are added after them (Spark puts its own
        # module options first).
        options = properties["spark.executor.extraJavaOptions"]
        assert f"-Dfrom.defaults=1 {JIT_OPTIONS['c1']}" in options, options
    finally:
        process.terminate()


def test_after_a_failure_spark_s_python_processes_of_this_group_are_ended() -> None:
    import subprocess
    import sys

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "pyspark.daemon"]
    # A command in a process group of its own, as `txstream run` is: one runner a dead JVM
    # left behind, one Python process that is not Spark's.
    command = (
        "import subprocess, sys\n"
        "from txstream.streaming.engine.session import end_spark\n"
        f"orphan = subprocess.Popen({sleeper!r})\n"
        f"other = subprocess.Popen({sleeper[:3]!r})\n"
        "end_spark(None)\n"
        "print(orphan.wait(timeout=5), other.poll())\n"
        "other.kill()\n"
    )
    elsewhere = subprocess.Popen(sleeper)  # Spark-like, in another group (this test's)
    try:
        done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True,
                              timeout=60, start_new_session=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["-15", "None"]  # SIGTERM, nothing printed; other lives
        assert done.stderr == ""
        assert elsewhere.poll() is None
    finally:
        elsewhere.kill()
        elsewhere.wait()


def _hang_up_on_accumulator_server(server: Any, token: str) -> None:
    """What the JVM does to pyspark's accumulator server at stop: one update, then it hangs up."""
    import socket
    import struct

    with socket.create_connection(server.server_address, timeout=5) as conn:
        conn.sendall(token.encode() + struct.pack("!i", 0))
        assert conn.recv(1) == b"\x01"


def test_stopping_spark_prints_no_traceback_for_the_jvm_hanging_up_on_accumulators(
        capsys: pytest.CaptureFixture[str]) -> None:
    """pyspark's ``SparkContext.stop`` closes the JVM before it flags its accumulator server down;
    the server read the hang-up as an ``EOFError`` and printed it after Ctrl-C (a CI run)."""
    import time
    from types import SimpleNamespace

    from pyspark.accumulators import _start_update_server

    from txstream.streaming.engine.session import _quiet_accumulator_server

    token = "t" * 16
    server = _start_update_server(token, False)
    try:  # as pyspark leaves it: the hang-up is printed
        _hang_up_on_accumulator_server(server, token)
        wait_until(lambda: "EOFError" in capsys.readouterr().err, timeout_s=5)
    finally:
        server.shutdown()
    server = _start_update_server(token, False)
    try:
        _quiet_accumulator_server(SimpleNamespace(sparkContext=SimpleNamespace(
            _accumulatorServer=server)))
        _hang_up_on_accumulator_server(server, token)
        time.sleep(1.5)  # the handler polls once a second
    finally:
        server.shutdown()
    assert "Traceback" not in capsys.readouterr().err
