#!/usr/bin/env bash
# Creates .venv and installs Seqlog with the exact versions in constraints.txt.
# Safe to run again: it only installs what is missing or different.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v python3 >/dev/null; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || {
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
        python3 -m venv .venv
    }
fi
.venv/bin/python -m pip install -q --upgrade 'pip>=23'
.venv/bin/python -m pip install -q -c constraints.txt -e '.[test]'
