"""The coordinator's checkpoint, wherever Spark can write: a plain path or any Hadoop URI.

The location is handed to Spark as given (``file:///x``, ``hdfs://nn:8020/x``, ``s3a://b/x``,
or a path, which resolves against the cluster's default file system). What txstream keeps
beside Spark's own files goes through the running session's Hadoop ``FileSystem``, with
Spark's ``CheckpointFileManager`` for atomic writes, so it lands where the checkpoint is and a
driver restarted on another host finds it.

``txstream.json`` records the state-key layout the checkpoint was started with: a
transaction's state lives under the key :func:`txstream.state.keys.state_key` gives its id, and with
another layout its end event would reach a key that never saw its half message. Spark cannot
tell (the state's key is just a number), so txstream refuses to run against another layout.
"""

from __future__ import annotations

import json
from typing import Any

from txstream.errors import ConfigError
from txstream.state.keys import KeyLayout

__all__ = ["Checkpoint", "LAYOUT_FILE", "pin_layout"]

LAYOUT_FILE = "txstream.json"
_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager"
_FLAGS = {"window_ms": "--key-window {}ms", "shards": "--key-shards {}",
          "fallback_buckets": "--buckets {}", "partitions": "--shuffle-partitions {}"}


class Checkpoint:
    """A checkpoint location, read and written through the session's Hadoop file system."""

    def __init__(self, spark: Any, location: str) -> None:
        self.location = location
        self._jvm = spark.sparkContext._jvm
        # The session's Hadoop configuration, as its streaming queries use it: the SQL settings
        # (the checkpoint file manager's class) and spark.hadoop.* included.
        conf = spark._jsparkSession.sessionState().newHadoopConf()
        self._root = self._jvm.org.apache.hadoop.fs.Path(location)
        self._fs = self._root.getFileSystem(conf)
        manager = getattr(self._jvm, _MANAGER)
        self._files = manager.create(self._root, conf)

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name)

    def read_text(self, name: str) -> str | None:
        """The file ``name`` under the checkpoint, or None if there is none."""
        path = self._path(name)
        if not self._files.exists(path):
            return None
        stream = self._files.open(path)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode("utf-8")

    def write_text(self, name: str, text: str) -> None:
        """Write ``name`` atomically: a reader sees the old file or the new one, whole."""
        path = self._path(name)
        self._files.mkdirs(path.getParent())
        out = self._files.createAtomic(path, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        except Exception:
            out.cancel()
            raise
        out.close()

    def last_committed_batch(self) -> int | None:
        """The id of the last batch Spark committed in this checkpoint, or None."""
        commits = self._path("commits")
        if not self._files.exists(commits):
            return None
        ids = [int(s.getPath().getName()) for s in self._fs.listStatus(commits)
               if s.getPath().getName().isdigit()]
        return max(ids, default=None)

    def batch_time(self, batch: int) -> int | None:
        """The time (ms) Spark gave batch ``batch``, from its offset log."""
        text = self.read_text(f"offsets/{batch}")
        try:
            # offsets/N: "v1", then the batch metadata (batchTimestampMs), then source offsets.
            return int(json.loads(text.splitlines()[1])["batchTimestampMs"]) if text else None
        except (IndexError, KeyError, ValueError):
            return None


def pin_layout(checkpoint: Checkpoint, layout: KeyLayout) -> None:
    """Record the state-key layout in the checkpoint, or refuse to run against another one."""
    wanted = layout.as_dict()
    text = checkpoint.read_text(LAYOUT_FILE)
    if text is None:
        checkpoint.write_text(LAYOUT_FILE, json.dumps(wanted) + "\n")
        return
    where = f"{checkpoint.location}/{LAYOUT_FILE}"
    try:
        pinned = json.loads(text)
        KeyLayout(**pinned)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where} is damaged or from an older txstream ({exc}); it records "
                          "the state-key layout: start a new checkpoint") from None
    if pinned != wanted:
        use = " ".join(_FLAGS[k].format(v) for k, v in pinned.items())
        raise ConfigError(
            f"checkpoint {checkpoint.location} was written with another state-key layout "
            f"({pinned}, not {wanted}): run with {use}, or start a new checkpoint")
