#!/usr/bin/env bash
# Express against its floor, in one run on four S3-compatible servers (three zones and the
# regional bucket), each its own process on this machine:
#
#   1. `nova bench` on Express streams at a moderate fixed rate: ack latency, and the mean
#      bundle size it produced;
#   2. raw conditional PUTs of objects of that size to all three zones at once, as the express
#      fanout writes them: each zone's PUT latency, and per object the time until two of the
#      three held it (the quorum);
#   3. the same load on Standard streams of the same star: ack latency, for comparison.
#
# The target (issue 12): Express ack p99 <= express linger + the slowest quorum member's PUT
# p99 + 5 ms, where the slowest quorum member is the zone whose p99 ranks second of three.
#
# Servers are s3s-fs 0.14.1 (disk-backed, fast; installed into .nova-test/s3s on first use);
# --moto uses moto server 5.2.5 instead. s3s-fs does not make concurrent conditional creates
# exclusive, which a benchmark without a second writer never needs. Built in release.
#
#   benches/express.sh [--moto] [--duration 20s] [--rate 8000] [--sessions 8]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh

SERVER=s3s-fs
DURATION=20s
RATE=8000
SESSIONS=8
while [ $# -gt 0 ]; do
    case "$1" in
        --moto) SERVER=moto ;;
        --duration) DURATION=$2; shift ;;
        --rate) RATE=$2; shift ;;
        --sessions) SESSIONS=$2; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

RECORD_BYTES=1024
BATCH_RECORDS=16
EXPRESS_LINGER_MS=5
STANDARD_LINGER_MS=50

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT

build_release
start_s3 regional
REGIONAL=$ENDPOINT
ZONES=()
for zone in az1 az2 az3; do
    start_s3 "$zone"
    ZONES+=("$ENDPOINT")
done

"$BIN/raw-put" --endpoint "$REGIONAL" --bucket nova --create-bucket --duration 0s
ZONE_ARGS=()
i=0
for endpoint in "${ZONES[@]}"; do
    i=$((i + 1))
    "$BIN/raw-put" --endpoint "$endpoint" --bucket zone --create-bucket --duration 0s
    ZONE_ARGS+=(--s3-express-zone "name=az$i,bucket=zone,endpoint=$endpoint")
done

NOVA_PORT=$(free_port)
METRICS_PORT=$(free_port)
"$BIN/novad" --data-dir "$WORK/novad" --listen "127.0.0.1:$NOVA_PORT" --metrics-addr "127.0.0.1:$METRICS_PORT" \
    --s3-bucket nova --s3-endpoint "$REGIONAL" --s3-path-style "${ZONE_ARGS[@]}" \
    --s3-express-linger-ms "$EXPRESS_LINGER_MS" --flight-linger-ms "$STANDARD_LINGER_MS" \
    --auditor false \
    >"$WORK/novad.log" 2>&1 &
PIDS+=($!)
wait_port "$NOVA_PORT"
NOVA=("$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" --output json)
METRICS=http://127.0.0.1:$METRICS_PORT/metrics

LOAD=(--sessions "$SESSIONS" --record-bytes "$RECORD_BYTES" --batch-records "$BATCH_RECORDS" --pipeline 4
      --rate "$RATE" --duration "$DURATION" --metrics-url "$METRICS" --quiet)
say "nova bench, Express: $SESSIONS sessions, $RATE records/s of $RECORD_BYTES B, batches of $BATCH_RECORDS"
BUNDLES_BEFORE=$(metric "$METRICS" nova_express_bundles_acked_total)
"${NOVA[@]}" bench --stream-prefix express --storage-class express "${LOAD[@]}" >"$WORK/express.json"
BUNDLES_AFTER=$(metric "$METRICS" nova_express_bundles_acked_total)
# The raw fanout writes objects of the size Nova's bundles had in that run, 4 at a time.
BUNDLE_BYTES=$(python3 -c "import json; r=json.load(open('$WORK/express.json')); b=float('$BUNDLES_AFTER')-float('$BUNDLES_BEFORE'); print(max(4096, round(r['bytes']/b)) if b > 0 else 65536)")
RAW_ARGS=()
for endpoint in "${ZONES[@]}"; do RAW_ARGS+=(--endpoint "$endpoint"); done
say "raw fanout PUTs: $BUNDLE_BYTES B objects (the mean bundle) to 3 zones at once, 4 at a time, for $DURATION ($SERVER_NOTE)"
"$BIN/raw-put" "${RAW_ARGS[@]}" --bucket raw --create-bucket --object-bytes "$BUNDLE_BYTES" \
    --concurrency 4 --duration "$DURATION" >"$WORK/raw.json"
say "nova bench, Standard: the same load"
"${NOVA[@]}" bench --stream-prefix standard --storage-class standard "${LOAD[@]}" >"$WORK/standard.json"

python3 - "$WORK" "$SERVER_NOTE" "$EXPRESS_LINGER_MS" "$STANDARD_LINGER_MS" "$BUNDLES_BEFORE" "$BUNDLES_AFTER" <<'PY'
import json, os, platform, subprocess, sys, datetime
work, server, linger, std_linger, b0, b1 = sys.argv[1:]
linger, std_linger = float(linger), float(std_linger)
raw = json.load(open(f"{work}/raw.json"))
ex = json.load(open(f"{work}/express.json"))
st = json.load(open(f"{work}/standard.json"))
bundles = float(b1) - float(b0)
zone_p99 = sorted(z["put_p99_ms"] for z in raw["zones"])
slowest_member = zone_p99[raw["quorum"] - 1]
target = linger + slowest_member + 5
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
print(f"Date: {datetime.date.today()}. Servers: {server}, four processes (three zones, one regional).")
print(f"Machine: {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}.")
print()
print("| writer | load | ack (or PUT) p50 | p99 | p99.9 |")
print("|---|---|---|---|---|")
for i, z in enumerate(raw["zones"]):
    print(f"| raw conditional PUT, zone {i + 1} | {raw['object_bytes']} B objects, 4 at a time | {z['put_p50_ms']:.1f} ms | {z['put_p99_ms']:.1f} ms | |")
print(f"| raw fanout, 2 of 3 zones hold it | same | {raw['put_p50_ms']:.1f} ms | {raw['put_p99_ms']:.1f} ms | |")
for name, r, lg in (("Nova Express", ex, linger), ("Nova Standard", st, std_linger)):
    a = r["ack_latency_ms"]
    print(f"| {name} (linger {lg:.0f} ms) | {r['records_per_sec']:.0f} records/s, {r['mib_per_sec']:.1f} MiB/s | {a['p50']:.1f} ms | {a['p99']:.1f} ms | {a['p999']:.1f} ms |")
print()
met = ex["ack_latency_ms"]["p99"] <= target
print(f"Target: Express ack p99 {ex['ack_latency_ms']['p99']:.1f} ms <= linger {linger:.0f} ms + slowest quorum member's PUT p99 "
      f"{slowest_member:.1f} ms + 5 ms = {target:.1f} ms: {'met' if met else 'missed'}.")
if bundles > 0:
    print(f"Express bundles: {bundles:.0f} in {ex['seconds']:.0f} s ({bundles / ex['seconds']:.0f}/s, "
          f"{ex['bytes'] / bundles / 1024:.1f} KiB each); zone PUTs per GiB: {3 * bundles / (ex['bytes'] / (1 << 30)):.0f}.")
for name, r in (("Express", ex), ("Standard", st)):
    if r["errors"]:
        print(f"{name} errors: {r['errors']}")
PY
