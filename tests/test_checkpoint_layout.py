"""The state-key layout is pinned in the checkpoint: another layout would strand transactions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streaming.engine.checkpoint import LAYOUT_FILE, pin_layout
from streaming.engine.config import RunConfig
from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings

DEFAULT = {"window_ms": 1000, "shards": 2, "fallback_buckets": 16, "partitions": 2}


def _config(checkpoint: Path, **layout: Any) -> RunConfig:
    return RunConfig(kafka=KafkaSettings("127.0.0.1:1"), checkpoint_dir=checkpoint, **layout)


def test_first_run_records_the_layout_and_a_restart_with_it_is_accepted(tmp_path: Path) -> None:
    pin_layout(_config(tmp_path / "cp"))
    assert json.loads((tmp_path / "cp" / LAYOUT_FILE).read_text()) == DEFAULT
    pin_layout(_config(tmp_path / "cp"))


@pytest.mark.parametrize("changed, flag", [
    (dict(buckets=64), "--buckets 16"),
    (dict(key_window_ms=5000), "--key-window 1000ms"),
    (dict(key_shards=4), "--key-shards 2"),
    (dict(shuffle_partitions=4), "--shuffle-partitions 2"),
])
def test_another_layout_is_refused_with_the_flags_to_use(
    tmp_path: Path, changed: dict[str, int], flag: str
) -> None:
    pin_layout(_config(tmp_path))
    with pytest.raises(ConfigError, match="written with another state-key layout") as refused:
        pin_layout(_config(tmp_path, **changed))
    assert flag in str(refused.value)
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == DEFAULT


def test_a_damaged_record_is_an_error_not_a_guess(tmp_path: Path) -> None:
    (tmp_path / LAYOUT_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="damaged"):
        pin_layout(_config(tmp_path))
    (tmp_path / LAYOUT_FILE).write_text('{"buckets": 16}\n')  # the layout of txstream <= 0.5
    with pytest.raises(ConfigError, match="older txstream"):
        pin_layout(_config(tmp_path))
