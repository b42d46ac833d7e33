#!/usr/bin/env bash
# What a fleet adds, in one run on one S3-compatible server (s3s-fs) and etcd from Debian's
# packages: the same `nova bench` load (1 KiB records in batches of 64) against one star on
# etcd, then against two stars on one etcd, for each of two shapes: 64 sessions over 64
# streams, and 256 sessions over 2,000 streams. The bench connects to the first star and sends
# each session to the star leading its streams.
#
# Each row gives MiB/s, ack p50/p99, the errors and redirects the bench saw, the stars' CPU per
# MiB, the placements made while the streams were created (by a one-second run before the
# measured one, whose wall time includes creating, describing and that second of appends), and
# the metastore's work per GiB appended in the measured run: etcd's own counts of
# transactions, puts and ranges (from its metrics endpoint). With --update-docs the fleet table
# in docs/performance.md is rewritten.
#
#   benches/fleet.sh [--duration 20s] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh

DURATION=20s
UPDATE_DOCS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) DURATION=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
ETCD=${NOVA_ETCD:-$(command -v etcd || true)}
[ -x "$ETCD" ] || { echo "etcd is needed (Debian's etcd-server package, or NOVA_ETCD)" >&2; exit 2; }

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT
build_release
start_s3

# Starts a one-member etcd in WORK/etcdN; sets ETCD_PORT and ETCD_PID.
start_etcd() {
    local n=$1 peer
    ETCD_PORT=$(free_port)
    peer=$(free_port)
    "$ETCD" --name n1 --data-dir "$WORK/etcd$n" --log-level warn \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "n1=http://127.0.0.1:$peer" >"$WORK/etcd$n.log" 2>&1 &
    ETCD_PID=$!
    PIDS+=("$ETCD_PID")
    wait_port "$ETCD_PORT"
}

SHAPES=("64 sessions × 64 streams|64|64" "256 sessions × 2,000 streams|256|2000")
ROW=0
for shape in "${SHAPES[@]}"; do
    IFS='|' read -r name sessions streams <<<"$shape"
    for stars in 1 2; do
        ROW=$((ROW + 1))
        say "$name, $stars star(s) on etcd, for $DURATION"
        start_etcd "$ROW"
        "$BIN/raw-put" --endpoint "$ENDPOINT" --bucket "fleet$ROW" --create-bucket --duration 0s
        ports=() metrics=() pids=()
        for i in $(seq 1 "$stars"); do
            port=$(free_port)
            mport=$(free_port)
            "$BIN/novad" --data-dir "$WORK/star$ROW-$i" --listen "127.0.0.1:$port" \
                --metrics-addr "127.0.0.1:$mport" --metastore "etcd://127.0.0.1:$ETCD_PORT" \
                --star-id "star-$i" --s3-bucket "fleet$ROW" --s3-endpoint "$ENDPOINT" --s3-path-style \
                --flight-max-bytes 8MiB --flight-max-inflight 8 --flight-linger-ms 50 --auditor false \
                >"$WORK/star$ROW-$i.log" 2>&1 &
            pids+=($!)
            PIDS+=($!)
            ports+=("$port")
            metrics+=("$mport")
        done
        for port in "${ports[@]}"; do wait_port "$port" || { cat "$WORK"/star$ROW-*.log >&2; exit 1; }; done
        # Every star in every star's view before any stream is placed.
        sleep 3
        # The streams are made (and placed) first, by a one-second run that keeps them; the
        # measured run then appends to them, so the metastore's counts are the write path's.
        begun=$(date +%s.%N)
        "$BIN/nova" --server "http://127.0.0.1:${ports[0]}" --output json bench --sessions "$sessions" \
            --streams "$streams" --stream-prefix fleet --reuse-streams --record-bytes 1KiB \
            --batch-records 64 --duration 1s --quiet >"$WORK/setup$ROW.json"
        ended=$(date +%s.%N)
        # Every metrics page once before the measured run and once after; the summary reads
        # the differences.
        save_page "http://127.0.0.1:$ETCD_PORT/metrics" "$WORK/etcd$ROW.before"
        for i in "${!metrics[@]}"; do
            save_page "http://127.0.0.1:${metrics[$i]}/metrics" "$WORK/star$ROW-$i.before"
        done
        "$BIN/nova" --server "http://127.0.0.1:${ports[0]}" --output json bench --sessions "$sessions" \
            --streams "$streams" --stream-prefix fleet --reuse-streams --record-bytes 1KiB \
            --batch-records 64 --duration "$DURATION" --quiet >"$WORK/row$ROW.json"
        save_page "http://127.0.0.1:$ETCD_PORT/metrics" "$WORK/etcd$ROW.after"
        for i in "${!metrics[@]}"; do
            save_page "http://127.0.0.1:${metrics[$i]}/metrics" "$WORK/star$ROW-$i.after"
        done
        printf 'name=%s\nstars=%s\nsetup=%s\n' "$name" "$stars" \
            "$(python3 -c "print($ended - $begun)")" >"$WORK/row$ROW.env"
        for pid in "${pids[@]}"; do stop_pid "$pid"; done
        stop_pid "$ETCD_PID"
        drop_bucket s3 "fleet$ROW"
    done
done

python3 - "$WORK" "$ROW" "$DURATION" "$(machine_line)" "$(git rev-parse --short HEAD)" <<'PY'
import datetime, json, sys
work, rows, duration, machine, commit = sys.argv[1:]
GIB = 1 << 30

def total(path, name):
    """The sum of every series of metric `name` on a saved metrics page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in open(path)
               if line.split("{")[0].split(" ")[0] == name)

def grown(prefix, name):
    """How much `name` grew between the pages saved before and after the measured run."""
    return total(f"{prefix}.after", name) - total(f"{prefix}.before", name)

lines = [
    f"Measured {datetime.date.today()} on {machine}, commit {commit}; server s3s-fs 0.14.1, "
    f"one etcd member (Debian's etcd-server) per row; {duration} per row, fresh stars; "
    "`nova bench` of 1 KiB records in batches of 64, through the first star.",
    "",
    "| load | stars | MiB/s | × one star | ack p50 | ack p99 | errors | redirects | star CPU per MiB | "
    "placements (set-up s) | etcd txns per GiB | puts per GiB | ranges per GiB |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]
alone = {}
for n in range(1, int(rows) + 1):
    r = json.load(open(f"{work}/row{n}.json"))
    env = dict(line.rstrip("\n").split("=", 1) for line in open(f"{work}/row{n}.env"))
    stars = int(env["stars"])
    gib = r["bytes"] / GIB
    mib = r["bytes"] / (1 << 20)
    cpu = sum(grown(f"{work}/star{n}-{i}", "nova_process_cpu_seconds_total") for i in range(stars))
    placements = sum(total(f"{work}/star{n}-{i}.after", "nova_fleet_placements_total")
                     for i in range(stars))
    etcd = {kind: grown(f"{work}/etcd{n}", f"etcd_mvcc_{kind}_total") for kind in ("txn", "put", "range")}
    setup = float(env["setup"])
    if stars == 1:
        alone[env["name"]] = r["mib_per_sec"]
    ratio = r["mib_per_sec"] / alone[env["name"]]
    errors = sum(r["errors"].values()) if r["errors"] else 0
    l = r["ack_latency_ms"]
    lines.append(
        f"| {env['name']} | {stars} | {r['mib_per_sec']:.1f} | {ratio:.2f} | {l['p50']:.0f} ms | {l['p99']:.0f} ms | "
        f"{errors} | {r['redirects']} | {cpu * 1000 / mib:.2f} ms | {placements:.0f} ({setup:.1f} s) | "
        f"{etcd['txn'] / gib:.0f} | {etcd['put'] / gib:.0f} | {etcd['range'] / gib:.0f} |")
table = "\n".join(lines)
print(table)
open(f"{work}/fleet.md", "w").write(table + "\n")
PY
if [ "$UPDATE_DOCS" = 1 ]; then update_docs_block fleet "$WORK/fleet.md"; fi
