#!/usr/bin/env bash
# Set up everything the project needs on a machine with only Python 3.11 and Java 17:
# a virtual environment with the pinned Python packages, and the JVM jars (Delta Lake, Spark's
# Kafka source, the Apache Kafka broker) fetched once from Maven Central and cached.
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
stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing Python packages"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
echo "setup: JVM jars (cached after the first run)"
.venv/bin/lakehouse setup
