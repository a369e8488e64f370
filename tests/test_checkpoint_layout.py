"""The bucket count is pinned in the checkpoint: another count would strand transactions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streaming.config import RunConfig
from streaming.query import LAYOUT_FILE, pin_layout
from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings


def _config(checkpoint: Path, buckets: int) -> RunConfig:
    return RunConfig(kafka=KafkaSettings("127.0.0.1:1"), checkpoint_dir=checkpoint,
                     buckets=buckets)


def test_first_run_records_the_count_and_a_restart_with_it_is_accepted(tmp_path: Path) -> None:
    pin_layout(_config(tmp_path / "cp", 16))
    assert json.loads((tmp_path / "cp" / LAYOUT_FILE).read_text()) == {"buckets": 16}
    pin_layout(_config(tmp_path / "cp", 16))


def test_another_count_is_refused_with_the_one_to_use(tmp_path: Path) -> None:
    pin_layout(_config(tmp_path, 64))
    with pytest.raises(ConfigError, match="written with --buckets 64, not 16"):
        pin_layout(_config(tmp_path, 16))
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == {"buckets": 64}


def test_a_damaged_record_is_an_error_not_a_guess(tmp_path: Path) -> None:
    (tmp_path / LAYOUT_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="damaged"):
        pin_layout(_config(tmp_path, 16))
