#!/usr/bin/env bash
# Nova beside its nearest open peer, in one run on one S3-compatible server (s3s-fs): first a
# star with one producer session of 8 KiB records (`nova bench`), then s2-lite 0.43.4 on the
# same server with `s2 bench` writing one stream of 8 KiB records. For each it takes append
# throughput, ack latency, the server process's CPU per MiB and its peak RSS, and prints the
# ratio of each figure (Nova ÷ s2-lite).
#
# s2-lite comes with the s2 CLI (crates.io `s2-cli`), installed into .nova-test/s2 on first use:
# a long build, once. Not part of the test suite. With --update-docs the peer table in
# docs/performance.md is rewritten.
#
#   benches/peer.sh [--duration 15s] [--sessions 1] [--target-mibps 1000] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh

DURATION=15s
SESSIONS=1
TARGET_MIBPS=1000
UPDATE_DOCS=0
S2_VERSION=0.43.4
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

S2=$ROOT/.nova-test/s2/bin/s2
if [ ! -x "$S2" ]; then
    say "installing s2-cli $S2_VERSION (with s2-lite) into .nova-test/s2: a long build, once"
    cargo install -q "s2-cli@$S2_VERSION" --locked --root "$ROOT/.nova-test/s2"
fi

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

say "s2-lite $S2_VERSION on bucket s2lite, s2 bench of 8 KiB records for $DURATION"
# (Bucket names need at least three characters.)
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket s2lite --create-bucket --duration 0s
S2_PORT=$(free_port)
AWS_ENDPOINT_URL_S3=$ENDPOINT S2LITE_NO_DASHBOARD=1 \
    "$S2" lite --bucket s2lite --port "$S2_PORT" >"$WORK/s2-lite.log" 2>&1 &
LITE=$!
PIDS+=("$LITE")
wait_port "$S2_PORT" || { cat "$WORK/s2-lite.log" >&2; exit 1; }
export S2_ACCOUNT_ENDPOINT=http://127.0.0.1:$S2_PORT S2_BASIN_ENDPOINT=http://127.0.0.1:$S2_PORT
export S2_ACCESS_TOKEN=unused-by-lite NO_COLOR=1
"$S2" create-basin s2://nova-peer >"$WORK/s2-basin.log" 2>&1 || {
    cat "$WORK/s2-basin.log" >&2
    exit 1
}
CPU_BEFORE=$(cpu_of "$LITE")
# s2 bench writes (with a live tail read beside it), then waits and reads everything back: the
# server's CPU and peak RSS are taken when it starts waiting, so the catch-up read is not
# counted.
"$S2" bench s2://nova-peer --record-size 8192 --target-mibps "$TARGET_MIBPS" \
    --duration "$DURATION" --catchup-delay 5s >"$WORK/s2.out" 2>&1 &
S2_BENCH=$!
CPU_AFTER=""
while kill -0 "$S2_BENCH" 2>/dev/null; do
    if [ -z "$CPU_AFTER" ] && grep -q "before catchup read" "$WORK/s2.out"; then
        CPU_AFTER=$(cpu_of "$LITE")
        LITE_RSS=$(peak_rss_of "$LITE")
    fi
    sleep 0.2
done
wait "$S2_BENCH" || { cat "$WORK/s2.out" >&2; exit 1; }
if [ -z "$CPU_AFTER" ]; then
    echo "s2 bench never said it was waiting before its catch-up read: its output changed, and" \
        "the write phase cannot be told apart" >&2
    exit 1
fi
stop_pid "$LITE"

python3 - "$WORK" "$DURATION" "$SESSIONS" "$S2_VERSION" "$CPU_BEFORE" "$CPU_AFTER" \
    "$LITE_RSS" "$(machine_line)" <<'PY'
import datetime, json, re, sys
work, duration, sessions, version, cpu_before, cpu_after, lite_rss, machine = sys.argv[1:]
nova = json.load(open(f"{work}/nova.json"))
out = re.sub(r"\x1b\[[0-9;]*m", "", open(f"{work}/s2.out").read())

write = re.search(r"Write: ([0-9.]+) MiB/s, [0-9.]+ records/s \(([0-9]+) bytes", out)
if not write:
    sys.exit(f"no write figures in s2 bench's output:\n{out}")
s2_mib, s2_bytes = float(write.group(1)), int(write.group(2))

def latency(name):
    """The ack latency table's row, in ms (the first table s2 bench prints is ack latency)."""
    section = out.split("Ack Latency Statistics", 1)[1]
    match = re.search(rf"{name}\s*:\s*([0-9.]+)\s*(ns|µs|us|ms|s)\b", section)
    if not match:
        sys.exit(f"no ack {name} in s2 bench's output:\n{out}")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"ns": 1e-6, "µs": 0.001, "us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

s2 = {
    "mib": s2_mib,
    "p50": latency("p50"),
    "p99": latency("p99"),
    "cpu": (float(cpu_after) - float(cpu_before)) * 1000 / (s2_bytes / (1 << 20)),
    "rss": int(lite_rss) / (1 << 20),
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
