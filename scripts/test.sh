#!/usr/bin/env bash
# The test command: installs what it needs, then lints, type-checks and runs the test suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh --run-slow` for soak and chaos runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
