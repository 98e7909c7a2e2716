#!/usr/bin/env bash
# Starts a local cluster (3 storage, 2 sequencer processes, file epoch store) and runs the demo
# workload against it. The cluster keeps running; stop it with:
#   .venv/bin/seqlog local down --dir "${SEQLOG_DIR:-/tmp/seqlog-demo}"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
DIR=${SEQLOG_DIR:-/tmp/seqlog-demo}
if [ -f "$DIR/cluster.json" ]; then .venv/bin/seqlog local down --dir "$DIR" || true; fi
.venv/bin/seqlog local up --dir "$DIR" --storage-nodes 3 --sequencers 2 --replication 3
.venv/bin/seqlog demo --dir "$DIR"
echo "web console: http://127.0.0.1:7400/ui/ (every node serves it)"
