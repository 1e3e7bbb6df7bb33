#!/usr/bin/env bash
# Set up and run the whole test suite: the code's shape (format, lint, the architecture's import
# contracts, the types, no logic written twice), chispa unit tests, then integration tests against
# a real Kafka broker (started by the tests on free ports), real Spark and real Delta tables.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --python-only
bin=.venv/bin
checks() {
  "$bin/ruff" format --check --quiet . || { echo "ruff format would change the files above: run .venv/bin/ruff format ." >&2; exit 1; }
  "$bin/ruff" check --quiet .
  "$bin/lint-imports" --no-cache >/dev/null || "$bin/lint-imports" --no-cache
  "$bin/mypy" --no-error-summary  # the packages and flags: [tool.mypy] in pyproject.toml
  "$bin/pylint" --disable=all --enable=duplicate-code --min-similarity-lines=6 --score=n \
    pipelines bronze silver gold declaration bench scripts
}
# The checks take one core while the JVM side of the set-up (jars, the class-data archive) runs.
checks & checking=$!
trap 'kill "$checking" 2>/dev/null || true' EXIT
echo "setup: JVM jars, checked against pipelines/resources/jars.sha256 (cached after the first run)"
"$bin/lakehouse" setup
wait "$checking" || { echo "error: the code's shape checks failed (above)" >&2; exit 1; }
trap - EXIT
# two workers (docs/development.md, "Tests"); `-n 0` after them runs one process
exec "$bin/python" -m pytest -n 2 --dist loadgroup "$@"
