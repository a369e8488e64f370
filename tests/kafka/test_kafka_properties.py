"""Kafka client properties: the properties format, Kafka's names in kafka-python's terms, the
order of the places settings come from, refused values, client ids, secrets and OAUTHBEARER.

Clients are real kafka-python clients: against the session's tansu broker, or (OAUTHBEARER,
which tansu does not speak) built with ``api.version`` given so that they do not bootstrap, and
a token endpoint served on loopback by the test.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kafka.net.sasl.oauth import SaslMechanismOAuth

from txstream.client import PushConsumer, TransactionListener, TransactionProducer
from txstream.client.options import resolve_settings
from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings, make_admin, make_consumer, make_producer
from txstream.kafka.oauth import ClientCredentialsTokenProvider
from txstream.kafka.properties import parse_properties, read_properties
from txstream.message import Decision, Message
from txstream.sinks.delivery import make_sink_producer
from txstream.sources.kafka_io import SourceOptions, consumer_for, drop_consumer
from txstream.streaming.cli.options import add_kafka_arguments, settings_of

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'username="alice" password="pa\\"ss";')


@pytest.fixture(autouse=True)
def _no_kafka_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BOOTSTRAP_SERVERS", "SECURITY_PROTOCOL", "SASL_MECHANISM", "SASL_USERNAME",
                 "SASL_PASSWORD", "SASL_PASSWORD_FILE", "SSL_CAFILE", "SSL_CERTFILE",
                 "SSL_KEYFILE", "KAFKA_CONFIG"):
        monkeypatch.delenv(f"TXSTREAM_{name}", raising=False)


def _write(tmp_path: Path, text: str, name: str = "client.properties") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_kafka_arguments(parser)
    return parser.parse_args(argv)


# --- the properties format -----------------------------------------------------------------------

def test_separators_comments_and_blank_lines() -> None:
    text = ("# a comment\n! another\n\n   \n"
            "equals=1\ncolon: 2\nspace   3\n  indented = 4 \nempty=\nbare\n"
            "twice = = 5\ntabbed\t\t6\n")
    assert parse_properties(text) == {
        "equals": "1", "colon": "2", "space": "3", "indented": "4 ", "empty": "", "bare": "",
        "twice": "= 5", "tabbed": "6"}


def test_escapes_as_java_reads_them() -> None:
    text = ("key\\ with\\ spaces=v\nk\\:colon=v\\=x\nunicode=caf\\u00e9\n"
            "controls=a\\tb\\nc\nplain=\\q\\#\npath=C:\\\\temp\\\\\n")
    assert parse_properties(text) == {
        "key with spaces": "v", "k:colon": "v=x", "unicode": "café", "controls": "a\tb\nc",
        "plain": "q#", "path": "C:\\temp\\"}
    with pytest.raises(ConfigError, match="malformed"):
        parse_properties("bad=\\u12g4")


def test_line_continuations() -> None:
    text = ("list=a,\\\n     b,\\\n\tc\n"
            "# comment ending in a backslash \\\nnext=1\n"
            "hash=x\\\n  # not a comment here\n"
            "ended=y\\\n\nafter=2\r\nwindows=3\rmac=4\nlast=z\\")
    assert parse_properties(text) == {
        "list": "a,b,c", "next": "1", "hash": "x# not a comment here", "ended": "y",
        "after": "2", "windows": "3", "mac": "4", "last": "z"}


def test_a_file_in_iso_8859_1_is_read_as_java_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "latin.properties"
    path.write_bytes("name=caf\u00e9\n".encode("iso-8859-1"))
    assert read_properties(path) == {"name": "café"}
    with pytest.raises(ConfigError, match="cannot read Kafka properties file"):
        read_properties(tmp_path / "missing.properties")


# --- Kafka's names in kafka-python's terms -------------------------------------------------------

def test_each_kind_of_client_gets_the_properties_it_takes() -> None:
    settings = KafkaSettings.from_properties({
        "acks": "all", "linger.ms": "42", "fetch.min.bytes": "7", "retry.backoff.ms": "250",
        "check.crcs": "false", "api.version": "2.8.0", "compression.type": "none",
        "ssl.endpoint.identification.algorithm": "", "retries": "3"})
    producer, consumer, admin = (settings.client_kwargs(k) for k in ("producer", "consumer",
                                                                        "admin"))
    assert (producer["acks"], producer["linger_ms"], producer["retries"]) == ("all", 42, 3)
    assert producer["compression_type"] is None and "fetch_min_bytes" not in producer
    assert (consumer["fetch_min_bytes"], consumer["check_crcs"]) == (7, False)
    assert "acks" not in consumer and "linger_ms" not in consumer
    assert "acks" not in admin and "fetch_min_bytes" not in admin
    for kw in (producer, consumer, admin):
        assert (kw["retry_backoff_ms"], kw["api_version"], kw["ssl_check_hostname"]) == (
            250, (2, 8, 0), False)


def test_librdkafka_and_java_names_become_the_settings_fields(tmp_path: Path) -> None:
    settings = KafkaSettings.from_properties({
        "bootstrap.servers": "k1:9093,k2:9093", "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "bob", "sasl.password": "pw",
        "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/c.pem",
        "ssl.key.location": "/k.pem", "ssl.key.password": "kp", "request.timeout.ms": "9000"})
    assert (settings.bootstrap_servers, settings.sasl_mechanism, settings.sasl_username,
            settings.sasl_password, settings.ssl_cafile, settings.ssl_certfile,
            settings.ssl_keyfile, settings.request_timeout_ms) == (
        "k1:9093,k2:9093", "SCRAM-SHA-512", "bob", "pw", "/ca.pem", "/c.pem", "/k.pem", 9000)
    kw = settings.client_kwargs("producer")
    assert kw["bootstrap_servers"] == ["k1:9093", "k2:9093"]
    assert (kw["sasl_plain_username"], kw["sasl_plain_password"], kw["ssl_password"]) == (
        "bob", "pw", "kp")


def test_jaas_config_of_plain_and_scram() -> None:
    plain = KafkaSettings.from_properties({"sasl.jaas.config": JAAS})
    assert (plain.sasl_username, plain.sasl_password) == ("alice", 'pa"ss')
    scram = KafkaSettings.from_properties({"sasl.jaas.config": (
        "org.apache.kafka.common.security.scram.ScramLoginModule required\n"
        "  username=carol\n  password=\"x y\";")})
    assert (scram.sasl_username, scram.sasl_password) == ("carol", "x y")
    with pytest.raises(ConfigError, match="Krb5LoginModule") as refused:
        KafkaSettings.from_properties({"sasl.jaas.config": (
            'com.sun.security.auth.module.Krb5LoginModule required password="topsecret";')})
    assert "topsecret" not in str(refused.value)


def test_stores_pem_taken_jks_refused_clearly() -> None:
    pem = KafkaSettings.from_properties({
        "ssl.truststore.location": "/trust.pem", "ssl.truststore.type": "PEM",
        "ssl.keystore.location": "/keystore.pem", "ssl.keystore.type": "pem"})
    assert (pem.ssl_cafile, pem.ssl_certfile) == ("/trust.pem", "/keystore.pem")
    # A later source replaces an earlier one's CA, whichever name each uses.
    assert pem.with_properties({"ssl.ca.location": "/other.pem"}).ssl_cafile == "/other.pem"
    assert KafkaSettings(ssl_cafile="/a.pem").with_properties(
        {"ssl.truststore.location": "/b.pem", "ssl.truststore.type": "PEM"}).ssl_cafile == "/b.pem"
    with pytest.raises(ConfigError, match=r"cannot read a JKS store.*ssl.truststore.type=PEM"):
        KafkaSettings.from_properties({"ssl.truststore.location": "/trust.jks"})
    with pytest.raises(ConfigError, match="cannot read a PKCS12 store"):
        KafkaSettings.from_properties({"ssl.keystore.location": "/k.p12",
                                       "ssl.keystore.type": "PKCS12"})


def test_an_unknown_name_is_refused_when_the_settings_are_made() -> None:
    with pytest.raises(ConfigError, match=r"^unknown Kafka client property linger\.msec "
                                          r"\(did you mean linger\.ms\?\)$"):
        KafkaSettings.from_properties({"linger.msec": "5"})
    with pytest.raises(ConfigError, match=r"unknown Kafka client property interceptor.classes"):
        KafkaSettings(properties={"interceptor.classes": "com.example.Tracing"})
    # ... also when the settings arrive as the Spark source's JSON option.
    as_json = json.dumps(dict(KafkaSettings().as_dict(), properties={"buffer.memorx": "1"}))
    with pytest.raises(ConfigError, match=r"buffer.memorx"):
        SourceOptions.parse({"kafka": as_json})
    with pytest.raises(ConfigError, match=r"key.serializer takes a Python object"):
        KafkaSettings.from_properties({"key.serializer": "org.example.Serializer"})
    with pytest.raises(ConfigError, match=r"linger.ms must be a number, got 'soon'"):
        KafkaSettings.from_properties({"linger.ms": "soon"})


@pytest.mark.parametrize("name, value", [
    ("acks", "1"), ("acks", "0"), ("enable.idempotence", "false"),
    ("enable.auto.commit", "true"), ("auto.offset.reset", "latest"), ("group.id", "mine"),
    ("group.instance.id", "static-1"), ("transactional.id", "tx-1"), ("retries", "0"),
    ("max.in.flight.requests.per.connection", "6"),
])
def test_values_that_break_a_guarantee_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^Kafka property {name}={value} is refused: "):
        KafkaSettings.from_properties({name: value})


def test_the_values_txstream_needs_may_be_given() -> None:
    for props in ({"acks": "all"}, {"acks": "-1"}, {"enable.idempotence": "true"},
                  {"enable.auto.commit": "false"}, {"auto.offset.reset": "earliest"}):
        KafkaSettings.from_properties(props)


# --- where settings come from, in order ----------------------------------------------------------

def test_layers_environment_file_properties_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TXSTREAM_BOOTSTRAP_SERVERS", "env:1")
    monkeypatch.setenv("TXSTREAM_SASL_USERNAME", "env-user")
    monkeypatch.setenv("TXSTREAM_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("TXSTREAM_SASL_MECHANISM", "PLAIN")
    file = _write(tmp_path, "bootstrap.servers=file:1\nsasl.username=file-user\nlinger.ms=1\n"
                            "sasl.password=file-pw\n")
    s = KafkaSettings.from_properties({"sasl.username": "prop-user", "linger.ms": "2"},
                                      file=file, env=True, sasl_password="field-pw")
    assert (s.bootstrap_servers, s.sasl_username, s.properties["linger.ms"], s.sasl_password,
            s.security_protocol) == ("file:1", "prop-user", "2", "field-pw", "SASL_PLAINTEXT")
    # The file TXSTREAM_KAFKA_CONFIG names beats the other variables; from_env reads it too.
    monkeypatch.setenv("TXSTREAM_KAFKA_CONFIG", file)
    assert KafkaSettings.from_env().sasl_username == "file-user"


def test_command_line_order_env_file_x_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv("TXSTREAM_SASL_USERNAME", "env-user")
    monkeypatch.setenv("TXSTREAM_BOOTSTRAP_SERVERS", "env:1")
    file = _write(tmp_path, "bootstrap.servers=file:1\nsasl.username=file-user\n"
                            "linger.ms=1\nmax.block.ms=5\n")
    args = _cli(["-X", "linger.ms=2", "--kafka-config", file, "-X", "linger.ms=3"])
    s = settings_of(args)
    assert (s.bootstrap_servers, s.sasl_username, s.properties) == (
        "file:1", "file-user", {"linger.ms": "3", "max.block.ms": "5"})
    args = _cli(["--kafka-config", file, "-X", "sasl.username=x-user", "--sasl-username",
                 "flag-user", "-X", "bootstrap.servers=x:1"])
    assert (args.bootstrap_servers, settings_of(args).sasl_username) == ("x:1", "flag-user")
    args = _cli(["--bootstrap-servers", "flag:1", "-X", "bootstrap.servers=x:1",
                 "--kafka-config", file])
    assert args.bootstrap_servers == "flag:1" == settings_of(args).bootstrap_servers


def test_servers_from_the_properties_are_seen_before_settings_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run and demo start an embedded broker when args.bootstrap_servers is empty."""
    file = _write(tmp_path, "bootstrap.servers=file:1\n")
    assert _cli([]).bootstrap_servers is None
    assert _cli(["--kafka-config", file]).bootstrap_servers == "file:1"
    assert _cli(["-X", "bootstrap.servers=x:1"]).bootstrap_servers == "x:1"
    monkeypatch.setenv("TXSTREAM_KAFKA_CONFIG", file)
    assert _cli([]).bootstrap_servers == "file:1"
    other = _write(tmp_path, "linger.ms=1\n", "other.properties")
    # A file on the command line replaces the variable's, servers included.
    assert _cli(["--kafka-config", other]).bootstrap_servers is None


def test_command_line_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    for argv in (["-X", "sasl.password"], ["--kafka-config", str(tmp_path / "none")]):
        with pytest.raises(SystemExit):
            _cli(argv)
        assert "error: argument" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"unknown Kafka client property lnger.ms"):
        settings_of(_cli(["-X", "lnger.ms=5"]))


def test_the_client_library_takes_a_file_and_properties(tmp_path: Path) -> None:
    file = _write(tmp_path, "linger.ms=1\nsecurity.protocol=SSL\nfetch.min.bytes=9\n")
    s = resolve_settings("h:1", None, {"kafka_config": file,
                                       "kafka_properties": {"linger.ms": "2"}})
    assert (s.bootstrap_servers, s.security_protocol, s.properties) == (
        "h:1", "SSL", {"linger.ms": "2", "fetch.min.bytes": "9"})
    base = KafkaSettings(bootstrap_servers="b:1", properties={"linger.ms": "7"})
    s = resolve_settings(None, base, {"kafka_config": file, "ssl_cafile": "/ca.pem"})
    assert (s.bootstrap_servers, s.properties["linger.ms"], s.ssl_cafile) == ("b:1", "1",
                                                                             "/ca.pem")
    with pytest.raises(ConfigError, match="unknown option"):
        resolve_settings(None, None, {"kafka_conf": file})


# --- secrets -------------------------------------------------------------------------------------

def test_secrets_never_show_in_repr() -> None:
    s = KafkaSettings.from_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": JAAS,
        "ssl.key.password": "keypw-123"}, extra={"sasl_plain_password": "extra-456"})
    text = repr(s)
    assert "alice" in text and "***" in text
    for secret in ('pa"ss', "pa\\\\\"ss", "keypw-123", "extra-456"):
        assert secret not in text


def test_secrets_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pw = _write(tmp_path, "from-file\n", "pw")
    s = KafkaSettings.from_properties({"sasl.password.file": pw, "ssl.key.password.file": pw})
    assert (s.sasl_password, s.properties["ssl.key.password"]) == ("from-file", "from-file")
    monkeypatch.setenv("TXSTREAM_SASL_PASSWORD_FILE", pw)
    assert KafkaSettings.from_env().sasl_password == "from-file"
    monkeypatch.setenv("TXSTREAM_SASL_PASSWORD", "also-given")
    with pytest.raises(ConfigError, match=r"sasl.password and sasl.password.file .*TXSTREAM_\*"):
        KafkaSettings.from_env()
    with pytest.raises(ConfigError, match=r"sasl.password.file: cannot read /no/such/file"):
        KafkaSettings.from_properties({"sasl.password.file": "/no/such/file"})


def test_a_secret_on_the_command_line_warns_without_showing_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    settings_of(_cli(["--sasl-password", "flag-secret", "-X", f"sasl.jaas.config={JAAS}",
                      "-X", "linger.ms=3"]))
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("--sasl-password, -X sasl.jaas.config on the command line is "
                              "visible in the process list")
    assert "flag-secret" not in warning and 'pa"ss' not in warning
    caplog.clear()
    file = _write(tmp_path, f"sasl.jaas.config={JAAS}\n")
    settings = settings_of(_cli(["--kafka-config", file, "-X", f"sasl.password.file={file}"]))
    assert settings.sasl_username == "alice" and caplog.records == []


# --- client ids, and properties on real clients --------------------------------------------------

class _Listener(TransactionListener):
    def execute_local_transaction(self, msg: Message, arg: object) -> Decision:
        return Decision.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> Decision:
        return Decision.COMMIT_MESSAGE


@pytest.mark.kafka
def test_every_client_names_its_role(kafka: KafkaSettings, unique: str) -> None:
    made: list[Any] = []
    try:
        made += [make_producer(kafka), make_consumer(kafka), make_admin(kafka),
                 make_sink_producer(kafka), make_consumer(settings_of(_cli(
                     ["--bootstrap-servers", kafka.bootstrap_servers])))]
        assert [c.config["client_id"] for c in made] == [
            "txstream-producer", "txstream-consumer", "txstream-admin", "txstream-sink",
            "txstream-cli"]
        # The command line's settings, as txstream run hands them to the query: the source
        # names its consumer; other clients there are named by their kind, not "cli".
        cli = settings_of(_cli(["--bootstrap-servers", kafka.bootstrap_servers]))
        options = SourceOptions.parse({"kafka": json.dumps(cli.as_dict())})
        assert consumer_for(options, "offsets").config["client_id"] == "txstream-source"
        drop_consumer(options, "offsets")
        made.append(make_admin(options.kafka))
        assert made[-1].config["client_id"] == "txstream-admin"
        producer = TransactionProducer(f"{unique}_g", kafka=kafka, listener=_Listener()).start()
        try:
            assert producer._producer is not None
            assert producer._producer.producer.config["client_id"] == \
                f"txstream-producer-{unique}_g"
            assert producer._checker is not None
            assert producer._checker.consumer.config["client_id"] == \
                f"txstream-checker-{unique}_g"
        finally:
            producer.shutdown()
        consumer = PushConsumer(f"{unique}_c", kafka=kafka)
        consumer.subscribe(f"{unique}_t")
        consumer.register_message_listener(lambda msgs: None)  # type: ignore[arg-type,return-value]
        consumer.start()
        try:
            assert consumer._consumer.config["client_id"] == f"txstream-consumer-{unique}_c"
            assert consumer._producer.config["client_id"] == f"txstream-consumer-{unique}_c"
        finally:
            consumer.shutdown()
    finally:
        for client in made:
            client.close()


@pytest.mark.kafka
def test_a_user_client_id_is_the_prefix_and_properties_reach_real_clients(
    kafka: KafkaSettings
) -> None:
    mine = kafka.with_properties({"client.id": "billing", "linger.ms": "42",
                                  "max.in.flight.requests.per.connection": "3",
                                  "fetch.min.bytes": "3", "connections.max.idle.ms": "60000"})
    producer, consumer, admin = make_producer(mine), make_consumer(mine), make_admin(mine)
    sink = make_sink_producer(mine)
    exact = make_consumer(KafkaSettings(kafka.bootstrap_servers, extra={"client_id": "as-is"}))
    try:
        assert [c.config["client_id"] for c in (producer, consumer, admin, sink, exact)] == [
            "billing-producer", "billing-consumer", "billing-admin", "billing-sink", "as-is"]
        # The user's value beats txstream's default (linger_ms 5) and kafka-python's ...
        assert (producer.config["linger_ms"], producer.config["acks"]) == (42, -1)
        assert producer.config["max_in_flight_requests_per_connection"] == 3
        # ... a caller's override beats the user's: the sink keeps one request in flight.
        assert sink.config["max_in_flight_requests_per_connection"] == 1
        assert (consumer.config["fetch_min_bytes"], consumer.config["enable_auto_commit"]) == (
            3, False)
        assert all(c.config["connections_max_idle_ms"] == 60000
                   for c in (producer, consumer, admin))
    finally:
        for client in (producer, consumer, admin, sink, exact):
            client.close()


# --- OAUTHBEARER ---------------------------------------------------------------------------------

class _TokenEndpoint(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]
    expires_in: float | None = 3600
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.requests.append({"path": self.path, "body": urllib.parse.parse_qs(body),
                              "headers": dict(self.headers)})
        answer: dict[str, Any] = {"access_token": f"token-{len(self.requests)}",
                                  "token_type": "bearer"}
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        data = json.dumps(answer).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[str, type[_TokenEndpoint]]]:
    handler = type("Handler", (_TokenEndpoint,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/oauth2/token", handler
    finally:
        server.shutdown()
        server.server_close()


def test_token_provider_posts_client_credentials_and_caches(
    endpoint: tuple[str, type[_TokenEndpoint]]
) -> None:
    url, handler = endpoint
    provider = ClientCredentialsTokenProvider(url, "my client", "s3cr:et", "kafka.write")
    assert provider.token() == "token-1" and provider.token() == "token-1"
    [request] = handler.requests
    assert request["path"] == "/oauth2/token"
    assert request["body"] == {"grant_type": ["client_credentials"], "scope": ["kafka.write"]}
    headers = request["headers"]
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    scheme, credentials = headers["Authorization"].split(" ")
    # RFC 6749 2.3.1: the id and secret are form-encoded, then joined and base64-encoded.
    assert (scheme, base64.b64decode(credentials).decode()) == ("Basic", "my+client:s3cr%3Aet")
    handler.expires_in = 1  # refreshed a tenth of its life before it ends
    short = ClientCredentialsTokenProvider(url, "c", "s")
    assert short.token() == "token-2" and short.token() == "token-2"
    time.sleep(0.95)
    assert short.token() == "token-3" and short.fetches == 2
    handler.expires_in = None  # no lifetime given: never reused
    once = ClientCredentialsTokenProvider(url, "c", "s")
    assert (once.token(), once.token()) == ("token-4", "token-5")


def test_token_endpoint_refusal_is_one_line_without_the_secret(
    endpoint: tuple[str, type[_TokenEndpoint]]
) -> None:
    url, handler = endpoint
    handler.status = 401
    with pytest.raises(ConfigError, match=r"answered HTTP 401 for client app$") as refused:
        ClientCredentialsTokenProvider(url, "app", "hunter2").token()
    assert "hunter2" not in str(refused.value)


def _oauth_properties(url: str, secret_file: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.token.endpoint.url": url,
            "sasl.oauthbearer.client.id": "txstream-app",
            "sasl.oauthbearer.client.secret.file": secret_file,
            "sasl.oauthbearer.scope": "kafka",
            # Given, the version spares the client its bootstrap: no broker needed here.
            "api.version": "3.0", "bootstrap.servers": "127.0.0.1:1"}


def test_clients_built_with_oauthbearer_properties_get_the_provider(
    endpoint: tuple[str, type[_TokenEndpoint]], tmp_path: Path
) -> None:
    url, handler = endpoint
    settings = KafkaSettings.from_properties(
        _oauth_properties(url, _write(tmp_path, "app-secret\n", "secret")))
    assert "app-secret" not in repr(settings)
    # JSON-able: the provider is made where a client is, from the properties.
    settings = KafkaSettings(**json.loads(json.dumps(settings.as_dict())))
    producer, consumer = make_producer(settings), make_consumer(settings)
    try:
        provider = producer.config["sasl_oauth_token_provider"]
        assert isinstance(provider, ClientCredentialsTokenProvider)
        assert consumer.config["sasl_oauth_token_provider"] is provider
        # kafka-python's OAUTHBEARER mechanism, as a connection runs it, asks our provider.
        first = SaslMechanismOAuth(**producer.config).auth_bytes()
        assert first == b"n,,\x01auth=Bearer token-1\x01\x01"
        assert SaslMechanismOAuth(**consumer.config).auth_bytes() == first
    finally:
        producer.close(timeout=0)
        consumer.close()
    [request] = handler.requests
    assert base64.b64decode(request["headers"]["Authorization"].split()[1]) == \
        b"txstream-app:app-secret"


def test_oauthbearer_needs_its_endpoint_and_credentials() -> None:
    with pytest.raises(ConfigError, match=r"OAUTHBEARER needs sasl\.oauthbearer\.token\."
                                           r"endpoint\.url, sasl\.oauthbearer\.client\.secret"):
        KafkaSettings.from_properties({"security.protocol": "SASL_SSL",
                                       "sasl.mechanism": "OAUTHBEARER",
                                       "sasl.oauthbearer.client.id": "x"})
    jaas = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'clientId="app" clientSecret="sec" scope="s1";')
    s = KafkaSettings.from_properties({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": jaas,
                                       "sasl.oauthbearer.token.endpoint.url": "http://idp/t"})
    assert (s.properties["sasl.oauthbearer.client.id"], s.properties["sasl.oauthbearer.scope"],
            s.properties["sasl.oauthbearer.client.secret"]) == ("app", "s1", "sec")
