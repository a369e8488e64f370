"""Hadoop's local file system without a forked ``chmod`` per file: a small jar, built on demand.

Spark writes every checkpoint and state file through Hadoop's ``LocalFileSystem``, which, with
no native Hadoop library (pyspark ships none), forks ``chmod`` to set each new file's mode:
several processes per micro-batch, on the driver between batches and inside the stateful tasks
(figures: docs/decisions/0006-no-fork-local-fs.md).
``resources/NoForkLocalFileSystem.java`` sets the mode with ``java.nio`` instead. It is
compiled against the Hadoop API jar pyspark ships, the first time a session needs it, into a
cache directory named by the source's hash; a machine without ``javac`` (a JRE only) keeps
Hadoop's own class and loses nothing but those milliseconds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

__all__ = ["NO_FORK_FS_CLASS", "SOURCE", "no_fork_fs_jar", "txstream_cache"]

log = logging.getLogger(__name__)

NO_FORK_FS_CLASS = "txstream.hadoop.NoForkLocalFileSystem"
SOURCE = Path(__file__).with_name("resources") / "NoForkLocalFileSystem.java"


def txstream_cache() -> Path:
    """txstream's cache of what a session builds once (this jar, the driver's class archive)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "txstream"


def _hadoop_api_jar() -> Path | None:
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return jars[-1] if jars else None


def no_fork_fs_jar(cache_dir: Path | None = None) -> Path | None:
    """The jar holding :data:`NO_FORK_FS_CLASS`, built if needed; None where it cannot be."""
    source = SOURCE.read_bytes()
    api = _hadoop_api_jar()
    if api is None:
        return None
    digest = hashlib.sha256(source + api.name.encode()).hexdigest()[:16]
    target = (cache_dir or txstream_cache()) / f"no-fork-local-fs-{digest}.jar"
    if target.exists():
        return target
    javac = shutil.which("javac")
    if javac is None:
        log.info("no javac: Hadoop's local file system will fork chmod for each checkpoint file")
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            classes = Path(tmp) / "classes"
            subprocess.run(
                [javac, "--release", "17", "-nowarn", "-cp", str(api), "-d", str(classes),
                 str(SOURCE)],
                check=True, capture_output=True, timeout=120,
            )
            staged = Path(tmp) / target.name
            with zipfile.ZipFile(staged, "w") as jar:
                for path in sorted(classes.rglob("*.class")):
                    jar.write(path, path.relative_to(classes).as_posix())
            # Another process building the same jar at once replaces it with identical bytes.
            shutil.move(str(staged), target.with_suffix(f".{os.getpid()}.tmp"))
            os.replace(target.with_suffix(f".{os.getpid()}.tmp"), target)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning("could not build %s (%s%s); Hadoop's own local file system stays",
                    NO_FORK_FS_CLASS, exc, f": {detail.decode(errors='replace')}" if detail else "")
        return None
    return target
