#!/usr/bin/env bash
# Nova against honest floors, in one run on one S3-compatible server (s3s-fs):
#
#   1. the raw-PUT client: 8 MiB conditional PUTs, 8 at a time (the object store's limit);
#   2. for each load, the relay floor (`relay` in benches/src/bin: the same gRPC append sessions
#      and windows, record bodies PUT in 8 MiB objects, 8 at a time, with no admission, framing,
#      checksums, index or metastore), then a fresh star under the same load:
#        - 64 sessions of 16 KiB records in batches of 16 (e2e's saturated load),
#        - 1 session of 8 KiB records in batches of 64 (what one producer sees),
#        - 64 sessions of 1 KiB records in batches of 64 (per-record costs);
#   3. s2-lite with `s2 bench` on one stream of 8 KiB records (benches/s2.sh; skipped with
#      --no-s2).
#
# Each row gives MiB/s, ack p50/p99, the server process's CPU per MiB, its peak RSS and, for a
# star, the memory formula that RSS must stay under (its budgets, sessions × the 64 KiB window,
# and the stated overhead: 48 MiB, 8 MiB of request messages and 64 KiB per session). With
# --update-docs the floors table in docs/performance.md is rewritten.
#
#   benches/floors.sh [--duration 20s] [--no-s2] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh
source benches/s2.sh

DURATION=20s
S2_ROW=1
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) DURATION=$2; shift ;;
        --no-s2) S2_ROW=0 ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$S2_ROW" = 1 ]; then s2_install; fi

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT
build_release
start_s3

say "raw PUTs: 8 MiB objects, 8 at a time, for $DURATION ($SERVER_NOTE)"
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket raw --create-bucket --object-bytes 8MiB \
    --concurrency 8 --duration "$DURATION" >"$WORK/raw.json"
drop_bucket s3 raw

LOADS=(
    "64 sessions, 16 KiB records|--sessions 64 --record-bytes 16KiB --batch-records 16 --pipeline 16"
    "1 session, 8 KiB records|--sessions 1 --record-bytes 8KiB --batch-records 64"
    "64 sessions, 1 KiB records|--sessions 64 --record-bytes 1KiB --batch-records 64"
)

ROW=0
for load in "${LOADS[@]}"; do
    name=${load%%|*}
    read -r -a bench <<<"${load#*|}"
    ROW=$((ROW + 1))

    say "relay floor: $name, for $DURATION"
    port=$(free_port)
    "$BIN/relay" --endpoint "$ENDPOINT" --bucket "relay$ROW" --listen "127.0.0.1:$port" \
        --object-bytes 8MiB --concurrency 8 --linger-ms 50 >"$WORK/relay$ROW.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$port" || { cat "$WORK/relay$ROW.log" >&2; exit 1; }
    cpu_before=$(cpu_of "$pid")
    "$BIN/nova" --server "http://127.0.0.1:$port" --output json bench "${bench[@]}" \
        --duration "$DURATION" --quiet >"$WORK/relay$ROW.json"
    echo "$cpu_before $(cpu_of "$pid") $(peak_rss_of "$pid")" >"$WORK/relay$ROW.proc"
    stop_pid "$pid"
    drop_bucket s3 "relay$ROW"

    say "Nova: $name, for $DURATION"
    "$BIN/raw-put" --endpoint "$ENDPOINT" --bucket "star$ROW" --create-bucket --duration 0s
    port=$(free_port)
    metrics=$(free_port)
    "$BIN/novad" --data-dir "$WORK/star$ROW" --listen "127.0.0.1:$port" --metrics-addr "127.0.0.1:$metrics" \
        --s3-bucket "star$ROW" --s3-endpoint "$ENDPOINT" --s3-path-style \
        --flight-max-bytes 8MiB --flight-max-inflight 8 --flight-linger-ms 50 --auditor false \
        >"$WORK/star$ROW.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$port" || { cat "$WORK/star$ROW.log" >&2; exit 1; }
    "$BIN/nova" --server "http://127.0.0.1:$port" --output json bench "${bench[@]}" \
        --duration "$DURATION" --metrics-url "http://127.0.0.1:$metrics/metrics" --quiet \
        >"$WORK/star$ROW.json"
    save_page "http://127.0.0.1:$metrics/metrics" "$WORK/star$ROW.metrics"
    stop_pid "$pid"
    drop_bucket s3 "star$ROW"
    printf '%s\t%s\n' "$ROW" "$name" >>"$WORK/rows.tsv"
done

if [ "$S2_ROW" = 1 ]; then
    say "s2-lite $S2_VERSION, s2 bench of 8 KiB records on one stream, for $DURATION"
    s2_bench "$DURATION" 1000
fi

python3 - "$WORK" "$DURATION" "$S2_VERSION" "$(machine_line)" "$(git rev-parse --short HEAD)" <<'PY'
import datetime, json, os, sys
work, duration, s2_version, machine, commit = sys.argv[1:]
MIB = 1 << 20
raw = json.load(open(f"{work}/raw.json"))

def formula(metrics, sessions):
    """The star's budgets (all formula terms but transport), sessions × the 64 KiB window, and
    the overhead docs/backpressure.md states: 48 MiB, 8 MiB of request messages and 64 KiB per
    session."""
    budgets = 0.0
    for line in open(metrics):
        if line.startswith("nova_memory_formula_bytes{") and 'term="transport"' not in line:
            budgets += float(line.rsplit(" ", 1)[1])
    return budgets + sessions * 64 * 1024 + (48 << 20) + (8 << 20) + sessions * 64 * 1024

lines = [
    f"Measured {datetime.date.today()} on {machine}, commit {commit}; server s3s-fs 0.14.1; "
    f"{duration} per row, a fresh server each; objects and flights of 8 MiB, 8 PUTs in flight, "
    "linger 50 ms. Ack latencies of the raw client are its PUTs'.",
    "",
    "| row | MiB/s | ack p50 | ack p99 | CPU per MiB | ÷ its relay floor | peak RSS | formula |",
    "|---|---|---|---|---|---|---|---|",
    f"| raw-PUT client | {raw['mib_per_sec']:.1f} | {raw['put_p50_ms']:.0f} ms | {raw['put_p99_ms']:.0f} ms | "
    f"{raw['cpu_ms_per_mib']:.2f} ms | | {raw['peak_rss_mib']:.0f} MiB | |",
]
summary = {}
for line in open(f"{work}/rows.tsv"):
    n, name = line.rstrip("\n").split("\t")
    relay = json.load(open(f"{work}/relay{n}.json"))
    before, after, rss = open(f"{work}/relay{n}.proc").read().split()
    relay_cpu = (float(after) - float(before)) * 1000 / (relay["bytes"] / MIB)
    star = json.load(open(f"{work}/star{n}.json"))
    s = star["star"]
    limit = formula(f"{work}/star{n}.metrics", star["sessions"])
    within = "" if s["peak_rss_mib"] * MIB <= limit else " (**over**)"
    errors = lambda r: f" ({sum(r['errors'].values())} errors)" if r["errors"] else ""
    for who, r, cpu, ratio, peak, limit_text in (
        ("relay floor", relay, relay_cpu, "1.00", int(rss) / MIB, "none (it bounds nothing)"),
        ("Nova", star, s["cpu_ms_per_mib"], f"{s['cpu_ms_per_mib'] / relay_cpu:.2f}", s["peak_rss_mib"],
         f"{limit / MIB:.0f} MiB{within}"),
    ):
        l = r["ack_latency_ms"]
        lines.append(f"| {who}: {name}{errors(r)} | {r['mib_per_sec']:.1f} | {l['p50']:.0f} ms | {l['p99']:.0f} ms | "
                     f"{cpu:.2f} ms | {ratio} | {peak:.0f} MiB | {limit_text} |")
    summary[name] = {"relay_cpu": relay_cpu, "star_cpu": s["cpu_ms_per_mib"]}
if os.path.exists(f"{work}/s2.json"):
    lite = json.load(open(f"{work}/s2.json"))
    lines.append(f"| s2-lite {s2_version}: `s2 bench`, 1 stream, 8 KiB records | {lite['mib_per_sec']:.1f} | "
                 f"{lite['p50_ms']:.0f} ms | {lite['p99_ms']:.0f} ms | {lite['cpu_ms_per_mib']:.2f} ms | | "
                 f"{lite['peak_rss_mib']:.0f} MiB | |")
table = "\n".join(lines)
print(table)
open(f"{work}/floors.md", "w").write(table + "\n")
PY
if [ "$UPDATE_DOCS" = 1 ]; then update_docs_block floors "$WORK/floors.md"; fi
