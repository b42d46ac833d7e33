#!/usr/bin/env bash
# How a star's figures move with what it is given, each row measured in one run on one
# S3-compatible server (s3s-fs, as in benches/e2e.sh), every row on a fresh star (so its peak
# RSS is its own) with its own bucket:
#
#   - the raw-PUT client first (8 MiB objects, 8 at a time): the CPU per MiB and PUT p99 the
#     star's figures are held against;
#   - one producer session of 8 KiB records in batches of 64 at stream windows of 64, 256 and
#     1024 KiB (--max-producer-sessions 1000 for all three, so the 1 MiB window fits HTTP/2's
#     connection window), then the 64 KiB one again at half its rate, for ack latency;
#   - 1, 100 and 10,000 streams at one total rate (64 sessions of 1 KiB records in batches of
#     16; with more streams than sessions, each session takes its share in turn);
#   - 1, 64 and 4,096 sessions, unthrottled (8 KiB records in batches of 16);
#   - records of 100 B, 8 KiB and 1 MiB, unthrottled (64 sessions; batches of about 64 KiB, one
#     record each for 1 MiB records).
#
# Each row gives MiB/s, ack p50/p99, the star's CPU per MiB, PUTs per GiB, peak RSS and the
# memory formula RSS must stay under. With --update-docs the two tables in docs/performance.md
# are rewritten.
#
#   benches/scaling.sh [--duration 15s] [--rate-mib 32] [--only windows|streams|sessions|records]
#                      [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh

DURATION=15s
RATE_MIB=32
ONLY=""
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) DURATION=$2; shift ;;
        --rate-mib) RATE_MIB=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
case "$ONLY" in
    "" | windows | streams | sessions | records) ;;
    *) echo "--only takes windows, streams, sessions or records" >&2; exit 2 ;;
esac
if [ -n "$ONLY" ] && [ "$UPDATE_DOCS" = 1 ]; then
    echo "--update-docs needs every row: leave out --only" >&2
    exit 2
fi

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT
build_release
start_s3

want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

say "raw PUTs: 8 MiB objects, 8 at a time, for $DURATION"
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket raw --create-bucket --object-bytes 8MiB \
    --concurrency 8 --duration "$DURATION" >"$WORK/raw.json"

# Runs one row: a fresh star with the given flags, `nova bench` with the given arguments, then
# the star's formula terms from its metrics page; the star is stopped afterwards.
ROW=0
row() {
    local group=$1 name=$2 star_flags=$3
    shift 3
    ROW=$((ROW + 1))
    local bucket=row$ROW port metrics pid
    "$BIN/raw-put" --endpoint "$ENDPOINT" --bucket "$bucket" --create-bucket --duration 0s
    port=$(free_port)
    metrics=$(free_port)
    # shellcheck disable=SC2086 # the flags are words on purpose
    "$BIN/novad" --data-dir "$WORK/star$ROW" --listen "127.0.0.1:$port" --metrics-addr "127.0.0.1:$metrics" \
        --s3-bucket "$bucket" --s3-endpoint "$ENDPOINT" --s3-path-style \
        --flight-max-bytes 8MiB --flight-max-inflight 8 --flight-linger-ms 50 --auditor false \
        $star_flags >"$WORK/star$ROW.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$port" || { cat "$WORK/star$ROW.log" >&2; exit 1; }
    say "$name: nova bench $*"
    "$BIN/nova" --server "http://127.0.0.1:$port" --output json bench --duration "$DURATION" \
        --metrics-url "http://127.0.0.1:$metrics/metrics" --quiet "$@" >"$WORK/row$ROW.json"
    curl -sf "http://127.0.0.1:$metrics/metrics" >"$WORK/row$ROW.metrics"
    stop_pid "$pid"
    printf '%s\t%s\t%s\t%s\n' "$ROW" "$group" "$name" "$star_flags" >>"$WORK/rows.tsv"
}

if want windows; then
    for window in 64 256 1024; do
        row windows "window $window KiB" "--grpc-stream-window-kib $window --max-producer-sessions 1000" \
            --sessions 1 --record-bytes 8KiB --batch-records 64 --pipeline 32
    done
    HALF=$(python3 -c "import json; print(round(json.load(open('$WORK/row$((ROW - 2)).json'))['records_per_sec'] / 2))")
    if [ "$HALF" -lt 1 ]; then
        echo "the 64 KiB row acknowledged nothing; see its errors in $WORK" >&2
        exit 1
    fi
    row windows "window 64 KiB, half load" "--grpc-stream-window-kib 64 --max-producer-sessions 1000" \
        --sessions 1 --record-bytes 8KiB --batch-records 64 --pipeline 32 --rate "$HALF"
fi
if want streams; then
    RATE=$((RATE_MIB * 1024))
    for streams in 1 100 10000; do
        row streams "$streams stream$([ "$streams" = 1 ] || echo s)" "" --sessions 64 --streams "$streams" --record-bytes 1KiB \
            --batch-records 16 --pipeline 32 --rate "$RATE"
    done
fi
if want sessions; then
    for sessions in 1 64 4096; do
        # One client connection carries every session: the star must allow that many streams
        # on it.
        row sessions "$sessions session$([ "$sessions" = 1 ] || echo s)" "--max-concurrent-streams 4096" --sessions "$sessions" --record-bytes 8KiB --batch-records 16 --pipeline 8
    done
fi
if want records; then
    row records "100 B records" "" --sessions 64 --record-bytes 100 --batch-records 640 --pipeline 8
    row records "8 KiB records" "" --sessions 64 --record-bytes 8KiB --batch-records 8 --pipeline 8
    row records "1 MiB records" "" --sessions 64 --record-bytes 1MiB --batch-records 1 --pipeline 8
fi

python3 - "$WORK" "$DURATION" "$RATE_MIB" "$(machine_line)" <<'PY'
import datetime, json, sys
work, duration, rate_mib, machine = sys.argv[1:]
raw = json.load(open(f"{work}/raw.json"))
MIB = 1 << 20

def terms(path):
    """The formula's budget terms from a metrics page (the transport term is taken apart)."""
    found = {}
    for line in open(path):
        if line.startswith("nova_memory_formula_bytes{"):
            name = line.split('term="', 1)[1].split('"', 1)[0]
            found[name] = float(line.rsplit(" ", 1)[1])
    return found

rows = []
for line in open(f"{work}/rows.tsv"):
    n, group, name, flags = line.rstrip("\n").split("\t")
    r = json.load(open(f"{work}/row{n}.json"))
    t = terms(f"{work}/row{n}.metrics")
    window_kib = 64
    words = flags.split()
    if "--grpc-stream-window-kib" in words:
        window_kib = int(words[words.index("--grpc-stream-window-kib") + 1])
    # Sessions × window while the run's sessions were open, plus the fixed overhead the
    # outage tests hold a star to (48 MiB and 64 KiB per session slot in use).
    sessions = r["sessions"]
    budgets = sum(v for k, v in t.items() if k != "transport")
    formula = budgets + sessions * window_kib * 1024 + (48 << 20) + sessions * 64 * 1024
    rows.append({"group": group, "name": name, "r": r, "window_kib": window_kib, "formula": formula,
                 "errors": sum((r["errors"] or {}).values())})

raw_cpu = raw["cpu_ms_per_mib"]
firsts = {}
def line(row):
    r, s = row["r"], row["r"]["star"]
    first = firsts.setdefault(row["group"], s["cpu_ms_per_mib"]) or float("nan")
    within = "yes" if s["peak_rss_mib"] * MIB <= row["formula"] else "**no**"
    errors = f" ({row['errors']} errors)" if row["errors"] else ""
    return (f"| {row['name']} | {r['mib_per_sec']:.1f}{errors} | {r['ack_latency_ms']['p50']:.0f} ms | "
            f"{r['ack_latency_ms']['p99']:.0f} ms | {s['cpu_ms_per_mib']:.2f} ms | {s['cpu_ms_per_mib'] / first:.2f} | "
            f"{s['cpu_ms_per_mib'] / raw_cpu:.2f} | "
            f"{s['puts_per_gib']:.0f} | {s['peak_rss_mib']:.0f} MiB | {row['formula'] / MIB:.0f} MiB | {within} |")

head = ("| row | MiB/s | ack p50 | ack p99 | star CPU per MiB | × its group's first row | × raw PUT client | PUTs per GiB | peak RSS | formula | within |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|")
stamp = (f"Measured {datetime.date.today()} on {machine}; server s3s-fs 0.14.1; {duration} per row, "
         f"a fresh star each; flights of 8 MiB, 8 in flight, linger 50 ms. Raw PUT client: "
         f"{raw['mib_per_sec']:.0f} MiB/s, PUT p99 {raw['put_p99_ms']:.0f} ms, {raw_cpu:.2f} ms CPU per MiB.")

windows = [r for r in rows if r["group"] == "windows"]
others = [r for r in rows if r["group"] != "windows"]
blocks = {}
if windows:
    lines = [stamp, "", "| window | MiB/s | ack p50 | ack p99 | star CPU per MiB | transport at 4,096 sessions |",
             "|---|---|---|---|---|---|"]
    for row in windows:
        r = row["r"]
        if "half" in row["name"]:
            continue
        lines.append(f"| {row['window_kib']} KiB | {r['mib_per_sec']:.1f} | {r['ack_latency_ms']['p50']:.0f} ms | "
                     f"{r['ack_latency_ms']['p99']:.0f} ms | {r['star']['cpu_ms_per_mib']:.2f} ms | "
                     f"{4096 * row['window_kib'] / 1024:.0f} MiB |")
    half = [row for row in windows if "half" in row["name"]]
    if half:
        r = half[0]["r"]
        bound = 50 + raw["put_p99_ms"] + 10
        p99 = r["ack_latency_ms"]["p99"]
        lines += ["", f"At half that rate ({r['mib_per_sec']:.1f} MiB/s, 64 KiB window) ack p50 is "
                  f"{r['ack_latency_ms']['p50']:.0f} ms and p99 {p99:.0f} ms, against linger + PUT p99 + 10 ms = "
                  f"{bound:.0f} ms: {'within' if p99 <= bound else 'over'}."]
    blocks["session"] = "\n".join(lines)
if others:
    lines = [stamp, "", head] + [line(row) for row in others]
    if any(row["group"] == "streams" for row in others):
        lines += ["", f"The stream rows are throttled to {rate_mib} MiB/s in total; the others are unthrottled."]
    blocks["scaling"] = "\n".join(lines)
for name, block in blocks.items():
    print(block)
    print()
    open(f"{work}/{name}.md", "w").write(block)
PY
if [ "$UPDATE_DOCS" = 1 ]; then
    update_docs_block session "$WORK/session.md"
    update_docs_block scaling "$WORK/scaling.md"
fi
