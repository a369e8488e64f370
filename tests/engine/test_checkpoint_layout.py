"""The checkpoint, through the session's Hadoop file system: the state-key layout pinned in it
(another layout would strand transactions), as a plain path or a URI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from txstream.errors import ConfigError
from txstream.state.keys import KeyLayout
from txstream.streaming.engine.checkpoint import LAYOUT_FILE, Checkpoint, pin_layout

pytestmark = pytest.mark.spark

DEFAULT = {"window_ms": 1000, "shards": 2, "fallback_buckets": 16, "partitions": 2}


def test_first_run_records_the_layout_and_a_restart_with_it_is_accepted(
    spark: Any, tmp_path: Path
) -> None:
    pin_layout(Checkpoint(spark, str(tmp_path / "cp")), KeyLayout())
    assert json.loads((tmp_path / "cp" / LAYOUT_FILE).read_text()) == DEFAULT
    pin_layout(Checkpoint(spark, str(tmp_path / "cp")), KeyLayout())


def test_a_file_uri_is_written_where_it_points_and_nowhere_else(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a URI folded into a path would land under the cwd
    uri = (tmp_path / "cp").as_uri()
    assert uri.startswith("file:///")
    checkpoint = Checkpoint(spark, uri)
    pin_layout(checkpoint, KeyLayout())
    checkpoint.write_text("offsets/0", "v1\n{\"batchTimestampMs\":1234}\n{}\n")
    assert json.loads((tmp_path / "cp" / LAYOUT_FILE).read_text()) == DEFAULT
    assert checkpoint.batch_time(0) == 1234
    assert checkpoint.last_committed_batch() is None
    (tmp_path / "cp" / "commits").mkdir()
    for batch in (0, 1, 11):
        (tmp_path / "cp" / "commits" / str(batch)).write_text("v1\n{}\n")
    assert checkpoint.last_committed_batch() == 11
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("changed, flag", [
    (dict(fallback_buckets=64), "--buckets 16"),
    (dict(window_ms=5000), "--key-window 1000ms"),
    (dict(shards=4), "--key-shards 2"),
    (dict(partitions=4), "--shuffle-partitions 2"),
])
def test_another_layout_is_refused_with_the_flags_to_use(
    spark: Any, tmp_path: Path, changed: dict[str, int], flag: str
) -> None:
    checkpoint = Checkpoint(spark, tmp_path.as_uri())
    pin_layout(checkpoint, KeyLayout())
    with pytest.raises(ConfigError, match="written with another state-key layout") as refused:
        pin_layout(checkpoint, KeyLayout(**changed))
    assert flag in str(refused.value)
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == DEFAULT


def test_a_damaged_record_is_an_error_not_a_guess(spark: Any, tmp_path: Path) -> None:
    checkpoint = Checkpoint(spark, str(tmp_path))
    (tmp_path / LAYOUT_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="damaged"):
        pin_layout(checkpoint, KeyLayout())
    (tmp_path / LAYOUT_FILE).write_text('{"buckets": 16}\n')  # the layout of txstream <= 0.5
    with pytest.raises(ConfigError, match="older txstream"):
        pin_layout(checkpoint, KeyLayout())
