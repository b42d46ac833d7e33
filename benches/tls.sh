#!/usr/bin/env bash
# What TLS costs a star, measured side by side in one run on one S3-compatible server: two
# stars with the same flags, one listening in plain text and one with TLS (a certificate from
# a throw-away CA made with openssl), each loaded by `nova bench` unthrottled, in alternating
# rounds (plain, TLS, plain, TLS, ...) so that the machine's noise falls on both alike. Reports
# append throughput, ack latency and the star's CPU per MiB for each, and their ratios.
#
# Uses s3s-fs 0.14.1 like benches/e2e.sh (installed on first use); release builds. With
# --update-docs the TLS table in docs/performance.md is rewritten.
#
#   benches/tls.sh [--duration 15s] [--rounds 2] [--sessions 16] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh

DURATION=15s
ROUNDS=2
SESSIONS=16
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) DURATION=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --sessions) SESSIONS=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT

build_release

say "a throw-away CA and a certificate for 127.0.0.1"
CERTS=$WORK/certs
mkdir -p "$CERTS"
(
    cd "$CERTS"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
        -subj /CN=bench-ca -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj /CN=localhost -keyout star.key -out star.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >ext.cnf
    openssl x509 -req -in star.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
        -extfile ext.cnf -out star.pem 2>/dev/null
)

start_s3
for bucket in plain tls; do
    "$BIN/raw-put" --endpoint "$ENDPOINT" --bucket "$bucket" --create-bucket --duration 0s
done

# One star per mode, same flags but the listener's.
star() {
    local mode=$1 port=$2 metrics=$3
    shift 3
    "$BIN/novad" --data-dir "$WORK/$mode" --listen "127.0.0.1:$port" --metrics-addr "127.0.0.1:$metrics" \
        --s3-bucket "$mode" --s3-endpoint "$ENDPOINT" --s3-path-style \
        --flight-max-bytes 8MiB --flight-max-inflight 8 --flight-linger-ms 50 --auditor false \
        "$@" >"$WORK/$mode.log" 2>&1 &
    PIDS+=($!)
    wait_port "$port"
}
PLAIN_PORT=$(free_port); PLAIN_METRICS=$(free_port)
TLS_PORT=$(free_port); TLS_METRICS=$(free_port)
star plain "$PLAIN_PORT" "$PLAIN_METRICS"
star tls "$TLS_PORT" "$TLS_METRICS" --tls-cert "$CERTS/star.pem" --tls-key "$CERTS/star.key"

bench() {
    local mode=$1 round=$2
    local server metrics
    if [ "$mode" = plain ]; then
        server=(--server "http://127.0.0.1:$PLAIN_PORT")
        metrics=http://127.0.0.1:$PLAIN_METRICS/metrics
    else
        server=(--server "https://127.0.0.1:$TLS_PORT" --tls-ca "$CERTS/ca.pem")
        metrics=http://127.0.0.1:$TLS_METRICS/metrics
    fi
    say "round $round, $mode: $SESSIONS sessions of 16 KiB records for $DURATION"
    "$BIN/nova" "${server[@]}" --output json bench --stream-prefix "r$round" --sessions "$SESSIONS" \
        --record-bytes 16KiB --batch-records 16 --pipeline 16 --duration "$DURATION" \
        --metrics-url "$metrics" --quiet >"$WORK/$mode-$round.json"
}
for round in $(seq 1 "$ROUNDS"); do
    bench plain "$round"
    bench tls "$round"
done

python3 - "$WORK" "$ROUNDS" "$SESSIONS" "$DURATION" <<'PY'
import datetime, json, os, platform, subprocess, sys
work, rounds, sessions, duration = sys.argv[1:]
rounds = int(rounds)
def runs(mode):
    return [json.load(open(f"{work}/{mode}-{r}.json")) for r in range(1, rounds + 1)]
def mean(values):
    return sum(values) / len(values)
def summary(mode):
    rs = runs(mode)
    return {
        "mib": mean([r["mib_per_sec"] for r in rs]),
        "cpu": mean([r["star"]["cpu_ms_per_mib"] for r in rs]),
        "p50": mean([r["ack_latency_ms"]["p50"] for r in rs]),
        "p99": mean([r["ack_latency_ms"]["p99"] for r in rs]),
        "rss": max(r["star"]["peak_rss_mib"] for r in rs),
        "errors": sum(sum((r["errors"] or {}).values()) for r in rs),
    }
plain, tls = summary("plain"), summary("tls")
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
lines = [
    f"Measured {datetime.date.today()} on {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}; "
    f"server s3s-fs 0.14.1; {sessions} sessions of 16 KiB records, {rounds} alternating rounds of {duration} per mode (means).",
    "",
    "| listener | append MiB/s | ack p50 | ack p99 | star CPU per MiB | star peak RSS |",
    "|---|---|---|---|---|---|",
]
for name, s in (("plain text", plain), ("TLS 1.3 (rustls, aws-lc)", tls)):
    lines.append(f"| {name} | {s['mib']:.1f} | {s['p50']:.0f} ms | {s['p99']:.0f} ms | {s['cpu']:.2f} ms | {s['rss']:.0f} MiB |")
lines.append(
    f"| TLS ÷ plain | {tls['mib'] / plain['mib']:.2f} | {tls['p50'] / plain['p50']:.2f} | "
    f"{tls['p99'] / plain['p99']:.2f} | {tls['cpu'] / plain['cpu']:.2f} | {tls['rss'] / plain['rss']:.2f} |"
)
if plain["errors"] or tls["errors"]:
    lines.append(f"\nErrors: plain {plain['errors']}, TLS {tls['errors']}.")
table = "\n".join(lines)
print(table)
open(f"{work}/tls.md", "w").write(table + "\n")
PY
if [ "$UPDATE_DOCS" = 1 ]; then update_docs_block tls "$WORK/tls.md"; fi
