#!/usr/bin/env bash
# Everything txstream needs on a fresh Debian/Ubuntu machine: a JRE for Spark, a venv, the project.
set -euo pipefail
VENV=${1:-.venv}
if ! command -v java >/dev/null 2>&1; then
  # The JDK: Spark needs a JVM, and javac builds streaming/engine/local_fs.py's jar.
  echo "setup: no java found, installing OpenJDK 17 (Spark needs a JVM)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
fi
if ! command -v chromium >/dev/null 2>&1; then
  # Headless Chromium: the console's browser tests (tests/console/test_console_web.py) drive Debian's
  # with playwright, which downloads no browser of its own here.
  echo "setup: no chromium found, installing Debian's (the console's browser tests use it)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium >/dev/null
fi
if ! command -v mvn >/dev/null 2>&1; then
  # Maven: fetches Apache Kafka's broker (deploy/kafka/pom.xml) for txstream/kafka_broker.py.
  echo "setup: no mvn found, installing Debian's Maven (it fetches Apache Kafka's jars)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq maven >/dev/null
fi
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# The coordinator's dependencies are an extra: a producer application installs `txstream` alone.
"$VENV/bin/python" -m pip install -q -e '.[coordinator,dev]'
# The benchmark (`txstream bench`), a distribution of its own beside the product.
"$VENV/bin/python" -m pip install -q --no-deps -e ./bench
# Apache Kafka's broker (KafkaBroker, `txstream broker --kafka`): its jars into the venv, once
# per version of deploy/kafka/pom.xml (the stamp is the pom's hash; Maven caches in ~/.m2).
KAFKA_DIR="$VENV/kafka"
KAFKA_POM_HASH=$(sha256sum deploy/kafka/pom.xml | cut -d' ' -f1)
if [ ! -d "$KAFKA_DIR/libs" ] || [ "$(cat "$KAFKA_DIR/pom.sha256" 2>/dev/null)" != "$KAFKA_POM_HASH" ]; then
  echo "setup: copying Apache Kafka's jars into $KAFKA_DIR/libs"
  rm -rf "$KAFKA_DIR"
  mkdir -p "$KAFKA_DIR"
  # Into a side folder first: an interrupted copy never looks complete. Debian's Maven 3.8
  # writes colour codes even with -B; sed drops them (pipefail keeps Maven's exit code).
  mvn -B -q -f deploy/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$(cd "$KAFKA_DIR" && pwd)/libs.partial" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
  mv "$KAFKA_DIR/libs.partial" "$KAFKA_DIR/libs"
  echo "$KAFKA_POM_HASH" > "$KAFKA_DIR/pom.sha256"
fi
# Spark's own Kafka connector (deploy/spark-kafka/pom.xml), for the benchmark's connector
# phases: the jars pyspark's own folder lacks (the same artifact in another version is Spark's
# and stays Spark's), once per version of the pom.
CONNECTOR_DIR="$VENV/spark-kafka"
CONNECTOR_POM_HASH=$(sha256sum deploy/spark-kafka/pom.xml | cut -d' ' -f1)
if [ ! -d "$CONNECTOR_DIR/jars" ] || [ "$(cat "$CONNECTOR_DIR/pom.sha256" 2>/dev/null)" != "$CONNECTOR_POM_HASH" ]; then
  echo "setup: copying Spark's Kafka connector into $CONNECTOR_DIR/jars"
  rm -rf "$CONNECTOR_DIR"
  mkdir -p "$CONNECTOR_DIR"
  PARTIAL="$(cd "$CONNECTOR_DIR" && pwd)/jars.partial"
  mvn -B -q -f deploy/spark-kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$PARTIAL" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
  SPARK_JARS=$("$VENV/bin/python" -c "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))")
  for jar in "$PARTIAL"/*.jar; do
    artifact=$(basename "$jar" | sed -E 's/-[0-9][^-]*\.jar$//')
    if ls "$SPARK_JARS" | grep -qE "^${artifact}-[0-9]"; then rm "$jar"; fi
  done
  mv "$PARTIAL" "$CONNECTOR_DIR/jars"
  echo "$CONNECTOR_POM_HASH" > "$CONNECTOR_DIR/pom.sha256"
fi
# Its class-data archive, for these jars and this JVM: each node starts ~2.5 s sooner (1 node
# 8.5 -> 5.9 s on 2 cores, docs/operations.md). Without it Kafka only starts slower. Made beside
# the driver's below (each is one JVM's training run, ~15 and ~45 s, on a core of its own).
JAVA_BUILD=$(java -version 2>&1 | tr '\n' ' ')
kafka_archive() {
  if [ ! -f "$KAFKA_DIR/classes.jsa" ] || [ "$(cat "$KAFKA_DIR/java.version" 2>/dev/null)" != "$JAVA_BUILD" ]; then
    echo "setup: writing Apache Kafka's class-data archive (starts a broker once)"
    if "$VENV/bin/python" scripts/kafka_class_archive.py; then
      echo "$JAVA_BUILD" > "$KAFKA_DIR/java.version"
    else
      echo "setup: no class-data archive: Apache Kafka starts without it, slower"
    fi
  fi
}
kafka_archive &
KAFKA_ARCHIVE=$!
# The class-data archive of a local coordinator's driver (Spark's classes, for this class path
# and JVM): every start is seconds shorter (docs/decisions/0033-class-archive.md). Made once, by
# a training run of about a minute; without it the coordinator only starts slower.
"$VENV/bin/python" -m txstream.streaming.engine.class_archive 2>&1 | grep -E "^class-data|Error" \
  || echo "setup: no class-data archive for Spark's driver: the coordinator starts without it"
wait "$KAFKA_ARCHIVE"
echo "setup: ready ($("$VENV/bin/python" --version), $(java -version 2>&1 | head -1))"
