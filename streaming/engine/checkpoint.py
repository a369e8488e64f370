"""What txstream keeps in a coordinator's checkpoint beside Spark's own files.

``txstream.json`` records the state-key layout the checkpoint was started with: a
transaction's state lives under the key :func:`state.keys.state_key` gives its id, and with
another layout its end event would reach a key that never saw its half message. Spark cannot
tell (the state's key is just a number), so txstream refuses to run against another layout.
"""

from __future__ import annotations

import json

from state.keys import KeyLayout
from streaming.engine.config import RunConfig
from txstream.errors import ConfigError

__all__ = ["LAYOUT_FILE", "pin_layout"]

LAYOUT_FILE = "txstream.json"

_FLAGS = {"window_ms": "--key-window {}ms", "shards": "--key-shards {}",
          "fallback_buckets": "--buckets {}", "partitions": "--shuffle-partitions {}"}


def pin_layout(config: RunConfig) -> None:
    """Record the state-key layout in the checkpoint, or refuse to run against another one."""
    config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = config.checkpoint_dir / LAYOUT_FILE
    wanted = config.layout.as_dict()
    if not path.exists():
        path.write_text(json.dumps(wanted) + "\n")
        return
    try:
        pinned = json.loads(path.read_text())
        KeyLayout(**pinned)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is damaged or from an older txstream ({exc}); it records "
                          "the state-key layout: start a new checkpoint") from None
    if pinned != wanted:
        use = " ".join(_FLAGS[k].format(v) for k, v in pinned.items())
        raise ConfigError(
            f"checkpoint {config.checkpoint_dir} was written with another state-key layout "
            f"({pinned}, not {wanted}): run with {use}, or start a new checkpoint")
