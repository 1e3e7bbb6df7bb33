#!/usr/bin/env bash
# The main job on the embedded default: set up, start the local Kafka broker, produce the
# reference stream with every twist, ingest it into bronze, print a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/lakehouse --env "${LAKEHOUSE_ENV:-local}" demo "$@"
