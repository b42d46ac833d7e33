#!/usr/bin/env bash
# Cold-read throughput through novagateway against raw ranged GETs of the same sections on
# the same server, in one run, and the gateway's footer cache hit rate.
#
#   1. load: nova bench writes --bytes (default 256MiB) over 16 streams into a star whose tail
#      cache is 1 MiB, so nearly everything is history in the object store;
#   2. raw: every section of every flight fetched with ranged GETs, 64 at a time (the
#      gateway's concurrency: 8 readers, each with up to 8 sections in flight);
#   3. gateway: every stream read from its start through one gateway, 8 readers at a time,
#      twice (cold caches, then warm).
#
# With --update-docs the results in docs/performance.md are rewritten.
#
# Uses s3s-fs 0.14.1 like benches/e2e.sh (installed on first use); release builds.
#   benches/gateway.sh [--bytes 256MiB]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh
BYTES=256MiB
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bytes) BYTES=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT

say "building novad, novagateway, nova and cold-read (release)"
build_release -p novagateway
start_s3
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket nova --create-bucket --duration 0s
S3=(--s3-bucket nova --s3-endpoint "$ENDPOINT" --s3-path-style)

NOVA_PORT=$(free_port)
# No auditor: the raw mode reads the flights' sections, which settling would move away.
"$BIN/novad" --data-dir "$WORK/novad" --listen "127.0.0.1:$NOVA_PORT" --metrics-addr "127.0.0.1:$(free_port)" \
    "${S3[@]}" --tail-window-cache-mib 1 --auditor false >"$WORK/novad.log" 2>&1 &
PIDS+=($!)
wait_port "$NOVA_PORT"
GW_PORT=$(free_port)
GW_METRICS=$(free_port)
"$BIN/novagateway" --listen "127.0.0.1:$GW_PORT" --metrics-addr "127.0.0.1:$GW_METRICS" \
    --star "http://127.0.0.1:$NOVA_PORT" "${S3[@]}" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_port "$GW_PORT"

say "loading $BYTES over 16 streams"
"$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" --output json bench --reuse-streams --sessions 16 --record-bytes 4KiB \
    --batch-records 64 --bytes "$BYTES" --quiet >"$WORK/load.json"

say "raw ranged GETs of every section, 64 at a time"
"$BIN/cold-read" raw --endpoint "$ENDPOINT" --bucket nova --concurrency 64 >"$WORK/raw.json"
say "every stream through the gateway, 8 readers (cold caches)"
CPU0=$(cpu_of "$GW_PID")
"$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8 >"$WORK/cold.json"
GW=http://127.0.0.1:$GW_METRICS/metrics
HITS_COLD=$(metric "$GW" nova_gateway_footer_cache_hits_total)
MISSES_COLD=$(metric "$GW" nova_gateway_footer_cache_misses_total)
CPU1=$(cpu_of "$GW_PID")
say "again (warm caches)"
"$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8 >"$WORK/warm.json"
HITS=$(metric "$GW" nova_gateway_footer_cache_hits_total)
MISSES=$(metric "$GW" nova_gateway_footer_cache_misses_total)
PEAK=$(metric "$GW" nova_gateway_fetch_pool_peak_bytes)
CPU2=$(cpu_of "$GW_PID")

python3 - "$WORK" "$HITS_COLD" "$MISSES_COLD" "$HITS" "$MISSES" "$PEAK" "$BYTES" "$(machine_line)" "$CPU0" "$CPU1" "$CPU2" <<'PY'
import datetime, json, sys
work, hits_cold, misses_cold, hits, misses, peak, loaded, machine, cpu0, cpu1, cpu2 = sys.argv[1:]
def per_mib(seconds, run):
    return float(seconds) * 1000 / (run["bytes"] / (1 << 20))
raw = json.load(open(f"{work}/raw.json"))
cold = json.load(open(f"{work}/cold.json"))
warm = json.load(open(f"{work}/warm.json"))
hc, mc, h, m = map(float, (hits_cold, misses_cold, hits, misses))
lines = [
    f"Measured {datetime.date.today()} on {machine}. Server: s3s-fs 0.14.1. Loaded {loaded} of 4 KiB records over 16 streams into a star with a 1 MiB tail cache.",
    "",
    "| measure | figures | ratio to raw ranged GETs |",
    "|---|---|---|",
    f"| raw ranged GETs, 64 at a time | {raw['mib_per_sec']:.1f} MiB/s ({raw['sections']} sections of {raw['objects']} objects) | 1.00 |",
    f"| through the gateway, cold caches | {cold['mib_per_sec']:.1f} MiB/s | {cold['mib_per_sec'] / raw['mib_per_sec']:.2f} |",
    f"| through the gateway, warm caches | {warm['mib_per_sec']:.1f} MiB/s | {warm['mib_per_sec'] / raw['mib_per_sec']:.2f} |",
    "",
    f"Footer cache hit rate: {hc / max(hc + mc, 1):.1%} on the cold pass, {(h - hc) / max((h - hc) + (m - mc), 1):.1%} on the warm pass. "
    f"Fetch pool peak: {float(peak) / (1 << 20):.1f} MiB of 64 MiB. "
    f"Gateway CPU per MiB served: {per_mib(float(cpu1) - float(cpu0), cold):.2f} ms cold, {per_mib(float(cpu2) - float(cpu1), warm):.2f} ms warm; "
    f"the raw client's per MiB fetched: {raw['cpu_ms_per_mib']:.2f} ms.",
]
table = "\n".join(lines)
print(table)
open(f"{work}/gateway.md", "w").write(table + "\n")
PY
if [ "$UPDATE_DOCS" = 1 ]; then update_docs_block gateway "$WORK/gateway.md"; fi
