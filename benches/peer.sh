#!/usr/bin/env bash
# Nova beside its nearest open peer, in one run on one S3-compatible server (s3s-fs): first a
# star with one producer session of 8 KiB records (`nova bench`), then s2-lite 0.43.4 on the
# same server with `s2 bench` writing one stream of 8 KiB records. For each it takes append
# throughput, ack latency, the server process's CPU per MiB and its peak RSS, and prints the
# ratio of each figure (Nova ÷ s2-lite).
#
# s2-lite is installed into .nova-test/s2 on first use (benches/s2.sh): a long build, once. Not
# part of the test suite. With --update-docs the peer table in
# docs/performance.md is rewritten.
#
#   benches/peer.sh [--duration 15s] [--sessions 1] [--target-mibps 1000] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh
source benches/s2.sh

DURATION=15s
SESSIONS=1
TARGET_MIBPS=1000
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) DURATION=$2; shift ;;
        --sessions) SESSIONS=$2; shift ;;
        --target-mibps) TARGET_MIBPS=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

s2_install

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT
build_release
start_s3


say "Nova: a star on bucket nova, $SESSIONS session(s) of 8 KiB records for $DURATION"
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket nova --create-bucket --duration 0s
NOVA_PORT=$(free_port)
METRICS_PORT=$(free_port)
"$BIN/novad" --data-dir "$WORK/novad" --listen "127.0.0.1:$NOVA_PORT" --metrics-addr "127.0.0.1:$METRICS_PORT" \
    --s3-bucket nova --s3-endpoint "$ENDPOINT" --s3-path-style \
    --flight-max-bytes 8MiB --flight-max-inflight 8 --flight-linger-ms 50 --auditor false \
    >"$WORK/novad.log" 2>&1 &
NOVAD=$!
PIDS+=("$NOVAD")
wait_port "$NOVA_PORT" || { cat "$WORK/novad.log" >&2; exit 1; }
"$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" --output json bench --sessions "$SESSIONS" \
    --record-bytes 8KiB --batch-records 64 --duration "$DURATION" \
    --metrics-url "http://127.0.0.1:$METRICS_PORT/metrics" --quiet >"$WORK/nova.json"
stop_pid "$NOVAD"

say "s2-lite $S2_VERSION, s2 bench of 8 KiB records for $DURATION"
s2_bench "$DURATION" "$TARGET_MIBPS"

python3 - "$WORK" "$DURATION" "$SESSIONS" "$S2_VERSION" "$(machine_line)" <<'PY'
import datetime, json, sys
work, duration, sessions, version, machine = sys.argv[1:]
nova = json.load(open(f"{work}/nova.json"))
lite = json.load(open(f"{work}/s2.json"))
s2 = {
    "mib": lite["mib_per_sec"],
    "p50": lite["p50_ms"],
    "p99": lite["p99_ms"],
    "cpu": lite["cpu_ms_per_mib"],
    "rss": lite["peak_rss_mib"],
}
star = nova["star"]
ours = {
    "mib": nova["mib_per_sec"],
    "p50": nova["ack_latency_ms"]["p50"],
    "p99": nova["ack_latency_ms"]["p99"],
    "cpu": star["cpu_ms_per_mib"],
    "rss": star["peak_rss_mib"],
}
lines = [
    f"Measured {datetime.date.today()} on {machine}; server s3s-fs 0.14.1; {duration} each; "
    f"Nova: {sessions} session(s), 8 KiB records in batches of 64; s2-lite {version}: `s2 bench`, one stream of 8 KiB records "
    "(its server CPU covers the writes and the live tail read beside them, not the catch-up read).",
    "",
    "| | append MiB/s | ack p50 | ack p99 | server CPU per MiB | server peak RSS |",
    "|---|---|---|---|---|---|",
    f"| Nova | {ours['mib']:.1f} | {ours['p50']:.0f} ms | {ours['p99']:.0f} ms | {ours['cpu']:.2f} ms | {ours['rss']:.0f} MiB |",
    f"| s2-lite | {s2['mib']:.1f} | {s2['p50']:.0f} ms | {s2['p99']:.0f} ms | {s2['cpu']:.2f} ms | {s2['rss']:.0f} MiB |",
    f"| Nova ÷ s2-lite | {ours['mib'] / s2['mib']:.2f} | {ours['p50'] / s2['p50']:.2f} | {ours['p99'] / s2['p99']:.2f} | "
    f"{ours['cpu'] / s2['cpu']:.2f} | {ours['rss'] / s2['rss']:.2f} |",
]
table = "\n".join(lines)
print(table)
open(f"{work}/peer.md", "w").write(table)
PY
if [ "$UPDATE_DOCS" = 1 ]; then update_docs_block peer "$WORK/peer.md"; fi
