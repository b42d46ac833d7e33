#!/usr/bin/env bash
# End-to-end performance, in one run against one S3-compatible server:
#
#   1. the raw PUT throughput and latency that server gives flight-sized objects at novad's
#      write concurrency (the limit Nova cannot beat);
#   2. `nova bench` against novad on the same server, unthrottled: append throughput, PUTs per
#      GiB, novad's CPU per MiB;
#   3. `nova bench` at half that rate: ack latency against the raw PUT latency;
#   4. five idle seconds: object-store requests while nothing is appended (should be zero).
#
# Throughput runs use s3s-fs 0.14.1 (fast, disk-backed; installed into .nova-test/s3s on first
# use); pass --moto to run against moto server instead (the correctness server, much slower).
# Everything is built in release. With --update-docs the results table in docs/performance.md
# is rewritten.
#
#   benches/e2e.sh [--moto] [--duration 20s] [--sessions 64] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh

SERVER=s3s-fs
DURATION=20s
SESSIONS=64
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --moto) SERVER=moto ;;
        --duration) DURATION=$2; shift ;;
        --sessions) SESSIONS=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

FLIGHT_BYTES=8MiB
INFLIGHT=8
LINGER_MS=50

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT

build_release
start_s3

say "raw PUTs: $FLIGHT_BYTES objects, $INFLIGHT at a time, for $DURATION ($SERVER_NOTE)"
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket raw --create-bucket --object-bytes "$FLIGHT_BYTES" \
    --concurrency "$INFLIGHT" --duration "$DURATION" >"$WORK/raw.json"
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket nova --create-bucket --duration 0s

NOVA_PORT=$(free_port)
METRICS_PORT=$(free_port)
"$BIN/novad" --data-dir "$WORK/novad" --listen "127.0.0.1:$NOVA_PORT" --metrics-addr "127.0.0.1:$METRICS_PORT" \
    --s3-bucket nova --s3-endpoint "$ENDPOINT" --s3-path-style \
    --flight-max-bytes "$FLIGHT_BYTES" --flight-max-inflight "$INFLIGHT" --flight-linger-ms "$LINGER_MS" \
    --auditor false \
    >"$WORK/novad.log" 2>&1 &
PIDS+=($!)
wait_port "$NOVA_PORT"
NOVA=("$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" --output json)
METRICS=http://127.0.0.1:$METRICS_PORT/metrics

say "nova bench, unthrottled: $SESSIONS sessions of 16 KiB records in batches of 16, for $DURATION"
"${NOVA[@]}" bench --sessions "$SESSIONS" --record-bytes 16KiB --batch-records 16 --pipeline 16 \
    --duration "$DURATION" --metrics-url "$METRICS" --quiet >"$WORK/saturated.json"
HALF=$(python3 -c "import json; print(round(json.load(open('$WORK/saturated.json'))['records_per_sec'] / 2))")

say "nova bench at half that rate ($HALF records/s)"
"${NOVA[@]}" bench --stream-prefix half --sessions "$SESSIONS" --record-bytes 16KiB --batch-records 16 \
    --pipeline 16 --rate "$HALF" --duration "$DURATION" --metrics-url "$METRICS" --quiet >"$WORK/half.json"

say "five idle seconds"
sleep 2
IDLE_BEFORE=$(metric "$METRICS" nova_object_store_requests_total)
sleep 5
IDLE_AFTER=$(metric "$METRICS" nova_object_store_requests_total)

python3 - "$WORK" "$SERVER_NOTE" "$LINGER_MS" "$FLIGHT_BYTES" "$INFLIGHT" "$IDLE_BEFORE" "$IDLE_AFTER" <<'PY'
import json, os, platform, subprocess, sys
work, server, linger_ms, flight, inflight, idle_before, idle_after = sys.argv[1:]
raw = json.load(open(f"{work}/raw.json"))
sat = json.load(open(f"{work}/saturated.json"))
half = json.load(open(f"{work}/half.json"))
linger_ms = float(linger_ms)
flight_bytes = raw["object_bytes"]
puts_per_gib_floor = (1 << 30) / flight_bytes
idle = float(idle_after) - float(idle_before)
rows = [
    ("Append throughput vs raw PUT throughput",
     f"{sat['mib_per_sec']:.1f} MiB/s vs {raw['mib_per_sec']:.1f} MiB/s",
     sat["mib_per_sec"] / raw["mib_per_sec"], "≥ 0.85",
     sat["mib_per_sec"] / raw["mib_per_sec"] >= 0.85),
    ("PUTs per GiB at saturation",
     f"{sat['star']['puts_per_gib']:.1f} (floor {puts_per_gib_floor:.0f})",
     sat["star"]["puts_per_gib"] / puts_per_gib_floor, "≤ 1.05",
     sat["star"]["puts_per_gib"] <= 1.05 * puts_per_gib_floor),
    ("Ack p99 at 50% load vs linger + raw PUT p99 + 10 ms",
     f"{half['ack_latency_ms']['p99']:.1f} ms vs {linger_ms + raw['put_p99_ms'] + 10:.1f} ms",
     half["ack_latency_ms"]["p99"] / (linger_ms + raw["put_p99_ms"] + 10), "≤ 1.0",
     half["ack_latency_ms"]["p99"] <= linger_ms + raw["put_p99_ms"] + 10),
    ("novad CPU per MiB vs the raw-PUT client's",
     f"{sat['star']['cpu_ms_per_mib']:.2f} ms vs {raw['cpu_ms_per_mib']:.2f} ms",
     sat["star"]["cpu_ms_per_mib"] / raw["cpu_ms_per_mib"], "≤ 1.5",
     sat["star"]["cpu_ms_per_mib"] <= 1.5 * raw["cpu_ms_per_mib"]),
    ("Object-store requests in 5 idle seconds", f"{idle:.0f}", idle, "= 0", idle == 0),
]
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
lines = [
    f"Server: {server}. Flights of {flight} ({flight_bytes} B), {inflight} in flight, linger {linger_ms:.0f} ms.",
    f"Machine: {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}.",
    "",
    "| measure | figures | ratio | target | met |",
    "|---|---|---|---|---|",
]
for name, figures, ratio, target, met in rows:
    lines.append(f"| {name} | {figures} | {ratio:.2f} | {target} | {'yes' if met else 'no'} |")
lines += [
    "",
    f"Raw PUT: {raw['objects']} objects in {raw['seconds']:.1f} s, p50 {raw['put_p50_ms']:.1f} ms, p99 {raw['put_p99_ms']:.1f} ms.",
    f"Saturated nova bench: {sat['sessions']} sessions, {sat['records_per_sec']:.0f} records/s, "
    f"ack p50 {sat['ack_latency_ms']['p50']:.1f} ms, p99 {sat['ack_latency_ms']['p99']:.1f} ms, "
    f"{sat['star']['puts']:.0f} PUTs, novad peak RSS {sat['star']['peak_rss_mib']:.0f} MiB, errors {sat['errors'] or 'none'}.",
    f"Half load: {half['records_per_sec']:.0f} records/s ({half['mib_per_sec']:.1f} MiB/s), "
    f"ack p50 {half['ack_latency_ms']['p50']:.1f} ms, p90 {half['ack_latency_ms']['p90']:.1f} ms, "
    f"p99 {half['ack_latency_ms']['p99']:.1f} ms, p99.9 {half['ack_latency_ms']['p999']:.1f} ms, max {half['ack_latency_ms']['max']:.1f} ms.",
]
table = "\n".join(lines)
print(table)
open(f"{work}/results.md", "w").write(table + "\n")
PY
if [ "$UPDATE_DOCS" = 1 ]; then update_docs_block results "$WORK/results.md"; fi
