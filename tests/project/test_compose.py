"""docker-compose.yml and the Dockerfile fit the CLI (no Docker engine here: parsed, not run).

Every ``txstream`` command a service runs must parse with the real parser, every
``TXSTREAM_*`` variable must reach the flag it is meant for, every bootstrap address must be
the kafka service's internal listener, the coordinator's health check must work against a
real ``/healthz``, every file a service mounts must be in the repository, and every metric the
Grafana dashboard queries must be one a real running coordinator exports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from txstream.streaming.cli import build_parser
from txstream.streaming.cli.options import config_from_args
from txstream.streaming.engine.health import HealthCheck
from txstream.streaming.engine.metric_totals import MetricsBoard
from txstream.streaming.engine.metrics import MetricsSources, serve_metrics

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
TXSTREAM = {name: s for name, s in SERVICES.items() if s.get("build") == "."}
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "txstream.json"


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _parse(command: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Parse as the container would: the service's environment set, the image's entrypoint."""
    for name in [k for k in os.environ if k.startswith("TXSTREAM_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        return build_parser().parse_args(command)
    except SystemExit as exc:  # argparse's way of saying "unknown flag"
        raise AssertionError(f"txstream {' '.join(command)} does not parse: exit {exc}") from None


def test_the_services_are_there() -> None:
    assert {"kafka", "coordinator", "console", "prometheus", "grafana", "demo-producer",
            "demo-consumer"} <= set(SERVICES)
    assert set(TXSTREAM) == {"coordinator", "console", "demo-producer", "demo-consumer"}


def test_kafka_keeps_its_log_on_a_volume() -> None:
    """A down/up must not leave the checkpoint ahead of empty topics."""
    kafka = SERVICES["kafka"]
    log_dir = _env(kafka)["KAFKA_LOG_DIRS"]
    volume, _, target = next(v for v in kafka["volumes"] if v.split(":")[1] == log_dir
                             ).partition(":")
    assert volume in COMPOSE["volumes"] and target == log_dir
    assert _env(kafka)["CLUSTER_ID"]  # the stored log is this cluster's on every start


def test_long_running_services_restart() -> None:
    for name in ("kafka", "coordinator", "console", "prometheus", "grafana"):
        assert SERVICES[name]["restart"] == "unless-stopped", name
    assert "restart" not in SERVICES["demo-producer"]  # it exits when done


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for item in service.get("volumes") or ():
        source, target = item.split(":")[:2]
        out.append((source, target))
    return out


def test_every_mounted_file_is_in_the_repository() -> None:
    mounted = [(name, source) for name, service in SERVICES.items()
               for source, _ in _mounts(service) if source.startswith("./")]
    assert {name for name, _ in mounted} == {"prometheus", "grafana"}
    for name, source in mounted:
        assert (ROOT / source).exists(), f"{name} mounts {source}, which is not there"
    for source, _ in (m for service in SERVICES.values() for m in _mounts(service)):
        assert source.startswith("./") or source in COMPOSE["volumes"], source


def test_prometheus_scrapes_the_coordinator(monkeypatch: pytest.MonkeyPatch) -> None:
    source = next(s for s, t in _mounts(SERVICES["prometheus"]) if t.endswith("prometheus.yml"))
    scrape = yaml.safe_load((ROOT / source).read_text())["scrape_configs"]
    targets = [t for job in scrape for c in job["static_configs"] for t in c["targets"]]
    coordinator = SERVICES["coordinator"]
    args = _parse(coordinator["command"], _env(coordinator), monkeypatch)
    assert targets == [f"coordinator:{args.metrics_port}"]


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    mounts = dict((t, s) for s, t in _mounts(SERVICES["grafana"]))
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((provisioning / "dashboards" / "txstream.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert (ROOT / mounts[path] / "txstream.json") == DASHBOARD
    dashboard = json.loads(DASHBOARD.read_text())
    uid = source["datasources"][0]["uid"]
    assert all(p["datasource"]["uid"] == uid for p in dashboard["panels"])
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("throughput", "pending", "lateness", "commit to visible", "discards", "lag"):
        assert topic in titles, topic


def test_kafka_is_a_pinned_official_image_in_kraft_mode() -> None:
    kafka = SERVICES["kafka"]
    assert re.fullmatch(r"apache/kafka:\d+\.\d+\.\d+", kafka["image"]), kafka["image"]
    env = _env(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@kafka:")
    assert "zookeeper" not in json.dumps(kafka).lower()
    assert kafka["healthcheck"]["test"]


def _listeners(text: str) -> dict[str, tuple[str, int]]:
    out = {}
    for item in text.split(","):
        name, _, rest = item.partition("://")
        host, _, port = rest.rpartition(":")
        out[name] = (host, int(port))
    return out


def test_every_bootstrap_address_is_the_internal_listener_of_kafka() -> None:
    env = _env(SERVICES["kafka"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    bound = _listeners(env["KAFKA_LISTENERS"])
    internal = [name for name, (host, _) in advertised.items() if host == "kafka"]
    assert len(internal) == 1, advertised
    host, port = advertised[internal[0]]
    assert bound[internal[0]][1] == port  # advertised where it listens
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols[internal[0]] == "PLAINTEXT"
    for name, service in TXSTREAM.items():
        assert _env(service)["TXSTREAM_BOOTSTRAP_SERVERS"] == f"{host}:{port}", name
    # The host's listener is published on the port it advertises.
    ext = [(h, p) for n, (h, p) in advertised.items() if h == "localhost"]
    assert ext and f"{ext[0][1]}:{ext[0][1]}" in SERVICES["kafka"]["ports"]


@pytest.mark.parametrize("name", sorted(TXSTREAM))
def test_commands_and_environment_fit_the_cli(name: str, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    service = TXSTREAM[name]
    assert service["build"] == "." and service["image"] == TXSTREAM["coordinator"]["image"]
    command, env = service["command"], _env(service)
    assert all(k.startswith("TXSTREAM_") for k in env), env
    args = _parse(command, env, monkeypatch)
    for var, value in env.items():
        flag = var.removeprefix("TXSTREAM_").lower()
        assert hasattr(args, flag), f"{var}: txstream {command[0]} has no --{flag}"
        if f"--{flag.replace('_', '-')}" not in command:  # a flag given beats the variable
            assert str(getattr(args, flag)) == value, f"{var} is not read by {command[0]}"


def test_the_coordinator_runs_with_the_demo_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    service = SERVICES["coordinator"]
    args = _parse(service["command"], _env(service), monkeypatch)
    assert args.command == "run"
    config = config_from_args(args, args.bootstrap_servers)
    assert (config.policy.transaction_timeout, config.policy.check_interval,
            config.policy.check_max) == (2000, 2000, 3)
    assert config.kafka.bootstrap_servers == "kafka:9092"
    # the checkpoint is on the volume, the metrics port published
    mount = service["volumes"][0].split(":")[1]
    assert str(config.checkpoint_dir).startswith(mount + "/")
    assert f"{config.metrics_port}:{config.metrics_port}" in service["ports"]
    assert service["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "checkpoints" in COMPOSE["volumes"]


def test_the_demo_services_wait_for_what_they_need(monkeypatch: pytest.MonkeyPatch) -> None:
    producer, consumer = SERVICES["demo-producer"], SERVICES["demo-consumer"]
    assert _parse(producer["command"], _env(producer), monkeypatch).role == "producer"
    assert _parse(consumer["command"], _env(consumer), monkeypatch).role == "consumer"
    assert producer["depends_on"]["coordinator"]["condition"] == "service_healthy"
    assert consumer["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_the_coordinator_healthcheck_asks_healthz() -> None:
    """The health check's own code, run against a real /healthz: 503 fails it, 200 passes."""
    test = SERVICES["coordinator"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and "/healthz" in test[3]
    problem: list[str | None] = ["query stopped"]
    health = HealthCheck(lambda: problem[0], MetricsBoard())
    server = serve_metrics(0, MetricsSources(health=health),
                           host="127.0.0.1")
    try:
        code = test[3].replace("127.0.0.1:9464", f"127.0.0.1:{server.port}")
        assert code != test[3]
        run = subprocess.run([sys.executable, "-c", code], timeout=30, capture_output=True)
        assert run.returncode == 1 and b"503" in run.stderr
        problem[0] = None
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    finally:
        server.close()


def _dashboard_metrics() -> set[str]:
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
             for t in p["targets"]]
    return {name for e in exprs for name in re.findall(r"\b(?:txstream|process)_\w+", e)}


def _exported(text: str) -> set[str]:
    """Every series name a scrape offers, also of families without samples yet."""
    from prometheus_client.parser import text_string_to_metric_families

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
        names |= {s.name for s in family.samples}
    return names


@pytest.mark.spark
def test_the_dashboard_queries_only_what_a_real_coordinator_exports(
    spark: object, kafka: Any, topics: Any, checkpoint_dir: Path, unique: str
) -> None:
    import urllib.request

    from tests.support.kafka_helpers import wait_until
    from tests.support.ports import reserve_port
    from txstream.state.policy import Policy
    from txstream.streaming.engine.config import RunConfig
    from txstream.streaming.engine.coordinator import Coordinator
    from txstream.streaming.engine.metrics import serve_coordinator

    config = RunConfig(kafka=kafka, topics=topics, policy=Policy(), checkpoint_dir=checkpoint_dir,
                       buckets=8, query_name=f"compose-{unique}", metrics_port=reserve_port(),
                       metrics_host="127.0.0.1")
    coordinator = Coordinator(config).start()
    server = serve_coordinator(coordinator)
    try:
        def scraped() -> set[str] | None:  # once the lag is known: every family is there
            with urllib.request.urlopen(server.url, timeout=10) as resp:
                names = _exported(resp.read().decode())
            return names if "txstream_input_lag_records" in names else None

        exported = wait_until(scraped, timeout_s=60)
    finally:
        server.close()
        coordinator.stop()
    wanted = _dashboard_metrics()
    assert len(wanted) >= 10, wanted
    assert wanted <= exported, sorted(wanted - exported)


def test_the_dockerfile_builds_the_txstream_image() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert re.search(r"openjdk-\d+-jdk-headless", text)  # Spark needs a JVM; javac, local_fs.py
    assert re.search(r"pip install (--no-deps )?\.", text)
    assert re.search(r'^ENTRYPOINT \["txstream"\]', text, re.M)
    cmd = json.loads(re.search(r"^CMD (\[.*\])", text, re.M).group(1))
    build_parser().parse_args(cmd)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "checkpoints"} <= set(ignored)
