#!/usr/bin/env bash
# Regenerate the hash-locked requirements from pyproject.toml, e.g. after changing a dependency:
#   bash requirements/lock.sh              # keep the current pins where they still fit
#   bash requirements/lock.sh --upgrade    # the newest versions the ranges allow
# Needs uv: scripts/setup.sh puts it in .venv/bin (PATH=.venv/bin:$PATH). --universal: the same locks serve Linux and macOS.
set -euo pipefail
cd "$(dirname "$0")/.."

compile() {
  uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
    --custom-compile-command "bash requirements/lock.sh" "$@"
}
compile "$@" requirements/build.in -o requirements/build.lock
compile "$@" pyproject.toml --extra dev -o requirements/dev.lock
# Constrained by the dev lock, so both locks pin the same versions.
compile "$@" pyproject.toml -c requirements/dev.lock -o requirements/runtime.lock
