"""The suite's groups hold: tests given one ``xdist_group`` by ``tests/conftest.py`` run on one
xdist worker under ``make test``'s ``--dist loadgroup``. pytest 9.2 broke that silently
(pytest-xdist#1386): the cluster tests then started a cluster and a submission on each
worker, side by side, and the whole suite took 15 % longer on 33 % more CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import group_of

# The mechanism of tests/conftest.py: a group added by a collection hook, before xdist's.
CONFTEST = '''
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.name.startswith("test_shared"):
            item.add_marker(pytest.mark.xdist_group(f"shared:{item.path.stem}"))
'''

MODULE = '''
import time

def test_shared_{n}_a():
    time.sleep(0.1)

def test_shared_{n}_b():
    time.sleep(0.1)

def test_alone_{n}_a():
    time.sleep(0.1)

def test_alone_{n}_b():
    time.sleep(0.1)
'''


def test_a_group_added_at_collection_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for n in (1, 2):
        (tmp_path / f"test_m{n}.py").write_text(MODULE.format(n=n))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
         "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})  # this run's own
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] .*PASSED \S+::(test_\w+?)(@\S+)?\s*$", done.stdout, re.M)
    assert len(ran) == 8, done.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, name, group in ran:
        if name.startswith("test_shared"):
            assert group == f"@shared:test_m{name.split('_')[2]}", (name, group)
            workers.setdefault(group, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), workers


def test_the_cluster_tests_share_one_group_and_the_crash_tests_another() -> None:
    assert group_of({"cluster", "spark"}) == "cluster"
    assert group_of({"crash", "spark"}) == "crash"
    assert group_of({"spark", "kafka"}) is None
