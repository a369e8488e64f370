"""txstream's Spark settings meet the user's: the user's win, lists are extended (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from txstream.streaming.engine.spark_settings import (
    LOG4J_CONFIG,
    PANDAS_WARNING_FILTER,
    defaults_file_settings,
    merge_settings,
    parse_properties,
    tuned_settings,
)


def _tuned(**changes: object) -> dict[str, str]:
    base = dict(shuffle_partitions=2, state_store="default", jit="c1", driver_memory="2g",
                executor_memory="1g", local=True, submitted=False)
    base.update(changes)
    return tuned_settings(**base)  # type: ignore[arg-type]


def test_the_ui_and_the_read_parallelism_are_left_to_spark() -> None:
    for local in (True, False):
        ours = _tuned(local=local)
        assert "spark.ui.enabled" not in ours and "spark.default.parallelism" not in ours


def test_executors_get_no_log4j_path_of_the_submitting_machine_but_the_warning_filter() -> None:
    ours = _tuned(local=False, submitted=True)
    assert "log4j" not in ours["spark.executor.extraJavaOptions"]
    assert ours["spark.executor.extraJavaOptions"] == \
        "-XX:TieredStopAtLevel=1 -XX:G1HeapRegionSize=4m"  # a 1g executor heap
    assert ours["spark.executorEnv.PYTHONWARNINGS"] == PANDAS_WARNING_FILTER
    # spark-submit started the driver's JVM: its heap and bind address are the user's.
    assert "spark.driver.memory" not in ours and "spark.driver.bindAddress" not in ours
    local = _tuned()
    assert f"file:{LOG4J_CONFIG}" in local["spark.driver.extraJavaOptions"]
    assert local["spark.driver.memory"] == "2g"
    assert local["spark.driver.bindAddress"] == "127.0.0.1"


def test_a_key_the_user_set_keeps_the_users_value() -> None:
    given = {"spark.ui.enabled": "true", "spark.sql.shuffle.partitions": "8",
             "spark.driver.memory": "4g", "spark.eventLog.enabled": "true"}
    merged = merge_settings(_tuned(), given)
    assert {k: merged[k] for k in given} == given
    assert merged["spark.python.worker.reuse"] == "true"  # unset by the user: txstream's


def test_the_users_jvm_options_are_extended_not_replaced() -> None:
    given = {"spark.executor.extraJavaOptions": "-XX:+UseG1GC -Dfoo=1 -XX:TieredStopAtLevel=4",
             "spark.executorEnv.PYTHONWARNINGS": "ignore::UserWarning"}
    merged = merge_settings(_tuned(local=False), given)
    # The user's -D option stays; their compiler level beats ours; our region size is added.
    assert merged["spark.executor.extraJavaOptions"] == \
        "-XX:+UseG1GC -Dfoo=1 -XX:TieredStopAtLevel=4 -XX:G1HeapRegionSize=4m"
    assert merged["spark.executorEnv.PYTHONWARNINGS"] == \
        f"ignore::UserWarning,{PANDAS_WARNING_FILTER}"


def test_spark_defaults_conf_is_read_where_spark_submit_reads_it(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "# comment\n! also a comment\n\nspark.ui.enabled  true\n"
        "spark.executor.extraJavaOptions=-XX:+UseG1GC -Dfoo=1\nspark.master: local[4]\n")
    expected = {"spark.ui.enabled": "true", "spark.master": "local[4]",
                "spark.executor.extraJavaOptions": "-XX:+UseG1GC -Dfoo=1"}
    assert defaults_file_settings({}, tmp_path) == expected  # SPARK_HOME: pyspark's
    assert defaults_file_settings({"SPARK_CONF_DIR": str(conf)}, tmp_path / "x") == expected
    assert defaults_file_settings({"SPARK_HOME": str(tmp_path / "none")}, tmp_path) == {}


@pytest.mark.parametrize("line, pair", [
    ("a=b", ("a", "b")), ("a = b c", ("a", "b c")), ("a: b", ("a", "b")), ("a b=c", ("a", "b=c")),
    ("flag", ("flag", "")),
])
def test_properties_lines(line: str, pair: tuple[str, str]) -> None:
    assert parse_properties(line) == dict([pair])


def test_settings_that_would_have_the_sink_write_twice_are_refused() -> None:
    """A stage run again numbers its tasks' attempts from 0, and speculative tasks run beside
    each other: neither kind of sink task knows to check what the other wrote."""
    from txstream.errors import ConfigError
    from txstream.streaming.engine.spark_settings import check_settings, tuned_settings

    tuned = tuned_settings(shuffle_partitions=2, state_store="default", jit="c1",
                           driver_memory="2g", executor_memory="1g", local=False,
                           submitted=True)
    assert tuned["spark.stage.maxConsecutiveAttempts"] == "1"
    check_settings(tuned)
    with pytest.raises(ConfigError, match=r"spark\.speculation"):
        check_settings({**tuned, "spark.speculation": "true"})
    with pytest.raises(ConfigError, match="maxConsecutiveAttempts=4"):
        check_settings({**tuned, "spark.stage.maxConsecutiveAttempts": "4"})
