"""The planner process's exit when a query stops: quiet on a hang-up, loud on anything else."""

from __future__ import annotations

import itertools
import sys

import pytest

from txstream import spark_worker
from txstream.spark_worker import quiet_hang_up


def _chained(*errors: BaseException) -> BaseException:
    """``errors[-1]`` raised while handling ``errors[-2]``, and so on, as Python chains them."""
    for earlier, later in itertools.pairwise(errors):
        later.__context__ = earlier
    return errors[-1]


@pytest.mark.parametrize("chain, quiet", [
    ((EOFError(), BrokenPipeError(), BrokenPipeError()), True),  # what pyspark's runner prints
    ((ConnectionResetError(),), True),
    ((ValueError("bad offset"), BrokenPipeError()), False),  # a real failure, then a hang-up
    ((EOFError(), RuntimeError("reader failed")), False),
])
def test_only_a_hang_up_is_kept_quiet(monkeypatch: pytest.MonkeyPatch,
                                      chain: tuple[BaseException, ...], quiet: bool) -> None:
    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, error, trace: printed.append(error))
    quiet_hang_up()
    quiet_hang_up()  # twice, as every reader of the process calls it: still one hook
    error = _chained(*chain)
    sys.excepthook(type(error), error, None)
    assert printed == ([] if quiet else [error])
    assert spark_worker._hung_up(error) is quiet
