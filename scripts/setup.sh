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
  # Headless Chromium: the console's browser tests (tests/test_console_web.py) drive Debian's
  # with playwright, which downloads no browser of its own here.
  echo "setup: no chromium found, installing Debian's (the console's browser tests use it)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium >/dev/null
fi
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# The coordinator's dependencies are an extra: a producer application installs `txstream` alone.
"$VENV/bin/python" -m pip install -q -e '.[coordinator,dev]'
# The benchmark (`txstream bench`), a distribution of its own beside the product.
"$VENV/bin/python" -m pip install -q --no-deps -e ./bench
echo "setup: ready ($("$VENV/bin/python" --version), $(java -version 2>&1 | head -1))"
