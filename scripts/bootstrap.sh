#!/usr/bin/env bash
# Creates .venv and installs Seqlog with the exact versions in constraints.txt, plus Debian's
# ZooKeeper server (it brings Java), which the epoch store tests and `seqlog local up
# --with-zookeeper` run. Safe to run again: it only installs what is missing or different.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/share/java/zookeeper.jar ]; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y zookeeper
fi
if ! command -v java >/dev/null; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y default-jre-headless
fi
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
