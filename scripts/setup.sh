#!/usr/bin/env bash
# Set up everything the project needs on a machine with only Python 3.11 and a Java 17 JDK:
# a virtual environment with the Python packages of the hash-checked locks in requirements/, and
# the JVM jars (Delta Lake, Spark's Kafka source, the Apache Kafka broker) fetched once from Maven
# Central, checked against their recorded SHA-256 and cached, and the project's JVM classes
# (pipelines/resources/java: the Delta log store, the session catalog, the one-pass JSON reader)
# compiled once with javac.
# `--python-only`: the virtual environment alone (scripts/test.sh sets up the JVM side itself).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "error: Python 3.11 is required (found: $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if ! command -v java >/dev/null 2>&1 && [ ! -x "${JAVA_HOME:-/nonexistent}/bin/java" ]; then
  echo "error: Java 17 is required: install it (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME" >&2
  exit 2
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
# Install again only when pyproject.toml or a lock changes.
stamp=.venv/.installed-$(cat pyproject.toml requirements/*.lock | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing the locked Python packages (requirements/dev.lock)"
  pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
  # pyspark is an sdist, and pip fetches the build dependencies of its isolated build environment
  # without checking hashes: so pip, setuptools and uv come from their own hashed lock first, and
  # everything builds against them (--no-build-isolation). uv installs in parallel.
  "${pip[@]}" --require-hashes -r requirements/build.lock
  uv=(.venv/bin/uv pip install --quiet --python .venv/bin/python --no-build-isolation)
  "${uv[@]}" --require-hashes -r requirements/dev.lock
  "${uv[@]}" --no-deps -e .
  # A dependency added to pyproject.toml but not to the locks shows up here.
  if ! broken=$(.venv/bin/uv pip check --quiet --python .venv/bin/python); then
    echo "$broken" >&2
    echo "error: the locks do not match pyproject.toml: run bash requirements/lock.sh" >&2
    exit 1
  fi
  rm -f .venv/.installed-*
  touch "$stamp"
fi
[ "${1:-}" = --python-only ] && exit 0
echo "setup: JVM jars, checked against pipelines/resources/jars.sha256 (cached after the first run)"
.venv/bin/lakehouse setup
