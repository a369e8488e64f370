"""The JVM txstream starts: its compilers are what the configuration says."""

from __future__ import annotations

from typing import Any

import pytest

from streaming.config import RunConfig
from streaming.session import JIT_OPTIONS, build_session
from txstream.errors import ConfigError


def _jvm_arguments(spark: Any) -> list[str]:
    bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    return list(bean.getInputArguments())


def test_the_session_runs_the_quick_compiler_only_by_default(spark: Any) -> None:
    arguments = _jvm_arguments(spark)
    assert JIT_OPTIONS["c1"] in arguments
    # the level is the JVM's own view, not only an argument it was given
    jvm = spark.sparkContext._jvm
    hotspot = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    option = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(hotspot)
    assert option.getVMOption("TieredStopAtLevel").getValue() == "1"


def test_an_unknown_jit_is_refused_before_any_jvm_starts() -> None:
    with pytest.raises(ConfigError, match="jit"):
        RunConfig(jit="c2")
    with pytest.raises(ValueError, match="jit"):
        build_session(jit="c2")
