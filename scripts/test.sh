#!/usr/bin/env bash
# Set up and run the whole test suite: chispa unit tests, then integration tests against a real
# Kafka broker (started by the tests on free ports), real Spark and real Delta tables.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
