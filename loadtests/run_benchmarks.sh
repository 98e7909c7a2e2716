#!/usr/bin/env bash
# Seqlog's append benchmark beside NATS JetStream R3, measured in the same run on this machine.
# Needs the peers set up once (see ../shared/peers/README.md: nats-server and a venv in
# /tmp/perf/venv with nats-py). Writes JSON lines to $OUT (default /tmp/seqlog-bench.jsonl).
#   loadtests/run_benchmarks.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-1}
OUT=${OUT:-/tmp/seqlog-bench.jsonl}
PEERS=$(cd ../shared/peers && pwd)
PEER_PY=${PEER_PY:-/tmp/perf/venv/bin/python}
DIR=$(mktemp -d /tmp/seqlog-bench.XXXXXX)
: > "$OUT"

nats() {
    (cd "$PEERS" && ./nats_cluster.sh start >/dev/null)
    "$PEER_PY" "$PEERS/bench_nats_js.py" --replicas 3 --inflight 1 --records 5000 | tail -1 >> "$OUT"
    "$PEER_PY" "$PEERS/bench_nats_js.py" --replicas 3 --inflight 64 --records 50000 \
        --mode workers | tail -1 >> "$OUT"
    "$PEER_PY" "$PEERS/bench_nats_js.py" --replicas 3 --inflight 256 --records 50000 \
        --mode async | tail -1 >> "$OUT"
    (cd "$PEERS" && ./nats_cluster.sh stop >/dev/null)
}

seqlog() {
    .venv/bin/seqlog local up --dir "$DIR/c" --replication 3 --fsync always >/dev/null
    local bench=(.venv/bin/python -m loadtests.bench_append --dir "$DIR/c" --size 1024 --loop uvloop)
    "${bench[@]}" --inflight 1 --records 3000 --label seqlog-r3-fsync | tail -1 >> "$OUT"
    "${bench[@]}" --inflight 64 --records 50000 --label seqlog-r3-fsync | tail -1 >> "$OUT"
    "${bench[@]}" --inflight 256 --records 50000 --label seqlog-r3-fsync | tail -1 >> "$OUT"
    "${bench[@]}" --inflight 4 --batch 64 --records 128000 --label seqlog-r3-fsync \
        | tail -1 >> "$OUT"
    "${bench[@]}" --inflight 16 --batch 64 --records 256000 --label seqlog-r3-fsync \
        | tail -1 >> "$OUT"
    # The same single-record rows with a client that costs ~60 us of CPU per request instead
    # of seqlog.Client's ~330 us: what the servers do when the client is not eating the cores.
    "${bench[@]}" --client raw --inflight 1 --records 3000 --label seqlog-r3-fsync \
        | tail -1 >> "$OUT"
    "${bench[@]}" --client raw --inflight 64 --records 50000 --label seqlog-r3-fsync \
        | tail -1 >> "$OUT"
    "${bench[@]}" --client raw --inflight 256 --records 50000 --label seqlog-r3-fsync \
        | tail -1 >> "$OUT"
    # The same 256 connections from wrk (a C load generator; done-when 3 allows either), at
    # log 1's sequencer so that nothing is forwarded.
    if command -v wrk >/dev/null; then
        local seed owner
        seed=$(.venv/bin/python -c "import json,sys; print('http://' + next(n['http'] for n \
in json.load(open(sys.argv[1]))['nodes'] if 'sequencer' in n['roles']))" "$DIR/c/cluster.json")
        owner=$(.venv/bin/python -m loadtests.raw_append_client "$seed" 1)
        SEQLOG_LOG=1 SEQLOG_SIZE=1024 SEQLOG_INFLIGHT=256 wrk -t1 -c256 -d10s \
            -s loadtests/wrk_append.lua "$owner" | tail -1 >> "$OUT"
    fi
    # The buffered writer (seqlog.BufferedWriter, 5 ms linger), 4096 appends outstanding:
    # incompressible payloads with lz4 (kept only where it shrinks a batch, so sent plain),
    # and JSON log lines (loadtests/json_log_lines.py, ~1 KiB) with zstd and lz4.
    local buffered=(.venv/bin/python -m loadtests.bench_buffered --dir "$DIR/c" --size 1024
                    --loop uvloop --inflight 4096 --records 300000 --label seqlog-r3-fsync)
    "${buffered[@]}" --payload random --compression lz4 | tail -1 >> "$OUT"
    "${buffered[@]}" --payload json --compression zstd | tail -1 >> "$OUT"
    "${buffered[@]}" --payload json --compression lz4 | tail -1 >> "$OUT"
    .venv/bin/seqlog local down --dir "$DIR/c" >/dev/null
    rm -rf "$DIR/c"
}

for _ in $(seq "$REPS"); do
    nats
    seqlog
done
rm -rf "$DIR"
.venv/bin/python -m loadtests.summarize "$OUT"
