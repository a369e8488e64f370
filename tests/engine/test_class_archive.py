"""The driver's class-data archive: made once for a class path, mapped by every local start,
passed over quietly when it is missing or refused (docs/decisions/0033-class-archive.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from txstream.class_data import QUIET
from txstream.streaming.engine.class_archive import archive_option, archive_path, train


def test_a_driver_maps_the_archive_made_for_its_class_path_and_no_other(tmp_path: Path) -> None:
    settings = {"spark.driver.extraClassPath": "/cache/no-fork.jar"}
    assert archive_option(settings, tmp_path) == ""  # none made: the JVM starts as before
    path = archive_path(settings, tmp_path)
    path.write_bytes(b"made")
    assert archive_option(settings, tmp_path).split() == [
        f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *QUIET]
    other = {"spark.driver.extraClassPath": "/cache/no-fork.jar:/opt/jdbc.jar"}
    assert archive_path(other, tmp_path) != path
    assert archive_option(other, tmp_path) == ""


@pytest.mark.parametrize("own", ["-Xshare:off", "-XX:SharedArchiveFile=/opt/mine.jsa",
                                 "-XX:ArchiveClassesAtExit=/tmp/new.jsa"])
def test_a_users_own_class_data_sharing_options_win(tmp_path: Path, own: str) -> None:
    settings = {"spark.driver.extraJavaOptions": f"-Dx=1 {own}"}
    archive_path(settings, tmp_path).write_bytes(b"made")
    assert archive_option(settings, tmp_path) == ""


def _mapped(pid: int, path: Path) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return any(line.rstrip().endswith(str(path)) for line in maps)


@pytest.mark.spark
def test_the_local_driver_maps_the_archive_setup_made(spark: Any) -> None:
    made = train()  # scripts/setup.sh made it; only a checkout never set up makes it here
    assert made is not None
    conf = dict(spark.sparkContext.getConf().getAll())
    assert archive_path(conf) == made
    proc = spark.sparkContext._gateway.proc
    assert proc is not None, "the session's JVM was not started by this process"
    assert _mapped(proc.pid, made), (
        f"the driver's JVM did not map {made}: the archive does not fit its class path or JVM "
        "(was it made before this session started? scripts/setup.sh makes it)")


@pytest.mark.spark
def test_an_archive_the_jvm_refuses_is_passed_over_quietly(tmp_path: Path) -> None:
    made = train()
    assert made is not None
    # A real archive, of another class path (this cache's own no-fork jar): what a driver
    # meets after an upgrade changed a jar under an archive's name.
    script = (
        "import shutil\n"
        "from txstream.streaming.engine.class_archive import archive_path\n"
        "from txstream.streaming.engine.local_fs import no_fork_fs_jar\n"
        "from txstream.streaming.engine.session import build_session, stop_spark\n"
        "from txstream.streaming.engine.spark_settings import with_no_fork_fs\n"
        "bad = archive_path(with_no_fork_fs({}, no_fork_fs_jar()))\n"
        f"shutil.copyfile({str(made)!r}, bad)\n"
        "spark = build_session(conf={'spark.ui.enabled': 'false'})\n"
        "print('counted', spark.range(5).count())\n"
        "stop_spark(spark)\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "counted 5" in done.stdout
    said = (done.stdout + done.stderr).lower()
    assert "cds" not in said and "shared archive" not in said, said[-3000:]


def test_an_archive_is_another_once_a_jar_of_its_class_path_moves_or_changes(
        tmp_path: Path) -> None:
    # The JVM refuses an archive whose class-path jars are elsewhere or changed (a cache
    # copied to another checkout, a venv installed again); such a start gets its own archive.
    jar = tmp_path / "a" / "no-fork.jar"
    jar.parent.mkdir()
    jar.write_bytes(b"jar")
    made = archive_path({"spark.driver.extraClassPath": str(jar)}, tmp_path)
    assert archive_path({"spark.driver.extraClassPath": str(jar)}, tmp_path) == made
    moved = tmp_path / "b" / "no-fork.jar"
    moved.parent.mkdir()
    moved.write_bytes(b"jar")
    os.utime(moved, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns))
    assert archive_path({"spark.driver.extraClassPath": str(moved)}, tmp_path) != made
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    assert archive_path({"spark.driver.extraClassPath": str(jar)}, tmp_path) != made
