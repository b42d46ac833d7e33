#!/usr/bin/env bash
# The Kafka listener's cost beside gRPC's, in one run against one star on one S3-compatible
# server: novad's CPU per MiB when
#
#   1. `nova bench` appends over gRPC (16 KiB records in batches of 16, 8 sessions on 8 streams);
#   2. librdkafka (confluent-kafka) produces the same volume of 16 KiB records to 8 partitions;
#   3. librdkafka consumes those partitions from the start;
#   4. `nova read` reads the same streams through gRPC.
#
# The ratios (Kafka over gRPC, per MiB) are what the Kafka path adds. Everything is built in
# release; the Python Kafka client comes from scripts/test's virtualenv (NOVA_PYTHON). With
# --update-docs the table in docs/performance.md is rewritten.
#
#   benches/kafka.sh [--moto] [--bytes 2GiB] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh

BYTES=2GiB
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --moto) SERVER=moto ;;
        --bytes) BYTES=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
PYTHON=${NOVA_PYTHON:-$ROOT/.nova-test/venv/bin/python}
BYTES_N=$(python3 -c "import sys; u={'KiB':1<<10,'MiB':1<<20,'GiB':1<<30}; s=sys.argv[1]; print(next((int(float(s[:-3])*m) for k,m in u.items() if s.endswith(k)), None) or int(s))" "$BYTES")

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT

build_release
start_s3
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket nova --create-bucket --duration 0s

NOVA_PORT=$(free_port)
KAFKA_PORT=$(free_port)
METRICS_PORT=$(free_port)
"$BIN/novad" --data-dir "$WORK/novad" --listen "127.0.0.1:$NOVA_PORT" --metrics-addr "127.0.0.1:$METRICS_PORT" \
    --kafka-listen "127.0.0.1:$KAFKA_PORT" --kafka-auto-create-partitions 8 \
    --s3-bucket nova --s3-endpoint "$ENDPOINT" --s3-path-style \
    --flight-max-bytes 8MiB --flight-max-inflight 8 --flight-linger-ms 50 --auditor false \
    >"$WORK/novad.log" 2>&1 &
NOVAD_PID=$!
PIDS+=($NOVAD_PID)
wait_port "$NOVA_PORT"
wait_port "$KAFKA_PORT"
NOVA=("$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" --output json)
METRICS=http://127.0.0.1:$METRICS_PORT/metrics

# Runs "$@" and prints novad's CPU ms per MiB of `counter`'s growth, and the MiB/s.
measure() {
    local counter=$1; shift
    local cpu0 bytes0 start cpu1 bytes1 end
    cpu0=$(cpu_of "$NOVAD_PID"); bytes0=$(metric "$METRICS" "$counter"); start=$(date +%s.%N)
    "$@" >"$WORK/last.out"
    end=$(date +%s.%N); cpu1=$(cpu_of "$NOVAD_PID"); bytes1=$(metric "$METRICS" "$counter")
    python3 -c "import sys; c0,c1,b0,b1,s,e=map(float,sys.argv[1:]); mib=(b1-b0)/(1<<20); print(f'{(c1-c0)*1000/mib:.2f} {mib/(e-s):.1f} {mib:.0f}')" \
        "$cpu0" "$cpu1" "$bytes0" "$bytes1" "$start" "$end"
}

say "gRPC: nova bench, 8 sessions on 8 streams, 16 KiB records in batches of 16, $BYTES"
read -r GRPC_CPU GRPC_RATE GRPC_MIB < <(measure nova_appended_bytes_total \
    "${NOVA[@]}" bench --sessions 8 --streams 8 --record-bytes 16KiB --batch-records 16 \
    --pipeline 16 --bytes "$BYTES" --stream-prefix grpc --reuse-streams --quiet)
say "Kafka: librdkafka producing $BYTES of 16 KiB records to 8 partitions"
"$PYTHON" benches/kafka_client.py produce "127.0.0.1:$KAFKA_PORT" kbench 8 1024 16384 >/dev/null
read -r KPROD_CPU KPROD_RATE KPROD_MIB < <(measure nova_appended_bytes_total \
    "$PYTHON" benches/kafka_client.py produce "127.0.0.1:$KAFKA_PORT" kbench 8 "$BYTES_N" 16384)
say "Kafka: librdkafka consuming the 8 partitions"
read -r KCONS_CPU KCONS_RATE KCONS_MIB < <(measure nova_read_bytes_total \
    "$PYTHON" benches/kafka_client.py consume "127.0.0.1:$KAFKA_PORT" kbench 8)
say "gRPC: nova read of the same 8 streams"
read_all() { for p in $(seq 0 7); do "$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" read "kbench/$p" --from 0 --format length-prefixed; done; }
read -r GREAD_CPU GREAD_RATE GREAD_MIB < <(measure nova_read_bytes_total read_all)

TABLE=$WORK/table.md
python3 - "$GRPC_CPU" "$GRPC_RATE" "$GRPC_MIB" "$KPROD_CPU" "$KPROD_RATE" "$KPROD_MIB" \
    "$KCONS_CPU" "$KCONS_RATE" "$KCONS_MIB" "$GREAD_CPU" "$GREAD_RATE" "$GREAD_MIB" "$SERVER_NOTE" >"$TABLE" <<'PY'
import os, platform, subprocess, sys
v = [float(x) for x in sys.argv[1:13]]
server = sys.argv[13]
(gc, gr, gm, kc, kr, km, cc, cr, cm, rc, rr, rm) = v
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
print(f"Server: {server}. Machine: {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}. Commit {commit}.")
print()
print("| path | MiB | MiB/s | novad CPU ms per MiB | Kafka ÷ gRPC |")
print("|---|---|---|---|---|")
print(f"| append: `nova bench` (gRPC) | {gm:.0f} | {gr:.1f} | {gc:.2f} | |")
print(f"| produce: librdkafka | {km:.0f} | {kr:.1f} | {kc:.2f} | {kc / gc:.2f} |")
print(f"| read: `nova read` (gRPC) | {rm:.0f} | {rr:.1f} | {rc:.2f} | |")
print(f"| fetch: librdkafka | {cm:.0f} | {cr:.1f} | {cc:.2f} | {cc / rc:.2f} |")
PY
cat "$TABLE"
if [ "$UPDATE_DOCS" = 1 ]; then
    update_docs_block kafka "$TABLE"
fi
