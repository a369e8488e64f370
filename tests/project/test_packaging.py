"""The sdist and the wheel, built from the checkout as it is (its links to the design's
folders included), each installed into a clean virtual environment as a producer application
installs txstream (no extra): ``txstream --help`` lists every command, a coordinator command
says what to install, and the client sends a transaction to the test broker."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from txstream.kafka import KafkaSettings, read_topic
from txstream.topics import Topics

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("run", "broker", "demo", "produce", "consume", "pending", "resolve", "history",
            "topics", "dead-letters", "console")  # bench: the benchmark package's plugin


def _checkout(into: Path) -> Path:
    """The tracked files as they are in the work tree, links kept as links."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = ROOT / name, into / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    assert (into / "txstream" / "state").is_symlink()  # the layout users' tools meet
    return into


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    src = _checkout(tmp_path_factory.mktemp("checkout"))
    dist = src / "dist"
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; "
                    "b.build_sdist('dist')"], cwd=src, check=True, capture_output=True,
                   timeout=300)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), "."], cwd=src, check=True, capture_output=True,
                   timeout=300)
    (sdist,) = dist.glob("txstream-*.tar.gz")
    (wheel,) = dist.glob("txstream-*.whl")
    return {"sdist": sdist, "wheel": wheel}


def _venv(path: Path, artifact: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    done = subprocess.run([str(path / "bin" / "pip"), "install", "-q", str(artifact)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return path / "bin"


@pytest.mark.parametrize("kind", ["sdist", "wheel"])
def test_an_install_from_the_checkout_runs_the_commands_and_the_client(
        kind: str, artifacts: dict[str, Path], kafka: KafkaSettings, tmp_path: Path) -> None:
    bin_dir = _venv(tmp_path / "venv", artifacts[kind])
    shown = subprocess.run([str(bin_dir / "txstream"), "--help"], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert all(command in shown.stdout for command in COMMANDS), shown.stdout
    refused = subprocess.run([str(bin_dir / "txstream"), "run"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0 and "txstream[coordinator]" in refused.stderr, refused.stderr
    topics = Topics.with_prefix(f"pk{uuid.uuid4().hex[:8]}_")
    sent = subprocess.run(
        [str(bin_dir / "txstream"), "produce", "--bootstrap-servers", kafka.bootstrap_servers,
         "--topic-prefix", topics.prefix, "--topic", "Orders", "--group", "shop", "--commit",
         f"from the {kind}"], capture_output=True, text=True, timeout=120)
    assert sent.returncode == 0, sent.stderr[-3000:]
    halves = read_topic(kafka, topics.half, timeout_s=10)
    assert [r.value for r in halves] == [f"from the {kind}".encode()]
