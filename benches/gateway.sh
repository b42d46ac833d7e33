#!/usr/bin/env bash
# Cold-read throughput through novagateway and from the star itself, against raw ranged GETs
# of the same sections on the same server, in one run; every process's CPU per MiB; and the
# gateway's footer cache hit rate.
#
#   1. load: nova bench writes --bytes (default 256MiB) over 16 streams into a star whose tail
#      cache is 1 MiB, so nearly everything is history in the object store;
#   2. raw: every section of every flight fetched with ranged GETs, 64 at a time (the
#      gateway's concurrency: 8 readers, each with up to 8 sections in flight);
#   3. rounds (--rounds, default 3), alternating with raw passes (raw, round, raw, ...,
#      round, raw). In each round every stream is read from its start five ways, 8 readers
#      at a time, the five taking turns to go first:
#      - through a fresh gateway (cold caches);
#      - through a gateway in service: a fresh one that has first read --filler-bytes of other
#        streams twice (filler-0..15, loaded after the measured streams; a range is cached
#        from its second request), so its object cache is full
#        of other data, as a long-running gateway's is, and these streams are cold in it;
#      - through a fresh gateway with read-ahead on (--read-ahead-bytes, 64MiB unless given),
#        which says what beginning each consumer's next page while its current one is still
#        being fetched gives (each consumer then holds up to two pages of read-ahead: 256MiB
#        lets all 8 readers read ahead);
#      - through the read floor, `relay --star` (benches/src/bin/relay.rs), which plans and
#        fetches each page as the gateway does (whole sections up to 8 MiB, 8 GETs in flight)
#        but knows every section from the start and does nothing else per read: what that
#        fetch plan costs against independent GETs, apart from the gateway's own work;
#      - through the read floor with each stream's window of 8 GETs kept full across pages
#        (`--cursor-sections 24`: the sections after a page are fetched while it is sent):
#        what a plan that does not stop at each page's end would give.
#      Each read is divided by the mean of the raw passes either side of its round (this
#      shared machine drifts by a fifth between passes a minute apart); each row is its
#      median round, and every round's figures are printed under the table;
#   4. star: the same from the star itself, once;
#   5. a fresh gateway reads everything three times, the third measured (warm caches); and fresh gateways
#      without and with read-ahead read it once more with readers that spend 20 ms on every
#      page (--think-ms 20), as consumers that process what they read do.
#
# On two cores the S3-compatible server, the reading process and the reader share the CPU, so
# the table gives each one's CPU per MiB beside the throughput: it says where a ratio comes from.
#
# With --pin the S3-compatible server runs on CPU 0 and everything else on CPU 1, as if the
# store were elsewhere (as S3 is): the serving process's CPU no longer takes the server's, so
# the ratios say whether the reading path keeps up with the store. Its table goes to its own
# block of docs/performance.md (gateway-pinned).
#
# With --store-latency-ms N every request to the server goes through a delay line
# (benches/src/bin/delay_proxy.rs) that holds each chunk N ms in each direction, as a store in
# another data centre (as S3 is: a GET's first byte takes tens of ms); the delay line runs
# with the server. Its table goes to the block gateway-latency.
#
# With --update-docs the results in docs/performance.md are rewritten.
#
# Uses s3s-fs 0.14.1 like benches/e2e.sh (installed on first use); release builds.
#   benches/gateway.sh [--bytes 256MiB] [--filler-bytes 320MiB] [--rounds 3] [--pin]
#                      [--store-latency-ms N] [--read-ahead-bytes 64MiB] [--update-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source benches/lib.sh
BYTES=256MiB
FILLER_BYTES=320MiB
UPDATE_DOCS=0
PIN=0
LATENCY=0
ROUNDS=3
AHEAD_BYTES=64MiB
while [ $# -gt 0 ]; do
    case "$1" in
        --bytes) BYTES=$2; shift ;;
        --filler-bytes) FILLER_BYTES=$2; shift ;;
        --update-docs) UPDATE_DOCS=1 ;;
        --pin) PIN=1 ;;
        --rounds) ROUNDS=$2; shift ;;
        --store-latency-ms) LATENCY=$2; shift ;;
        --read-ahead-bytes) AHEAD_BYTES=$2; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
    echo "--rounds must be a whole number of at least 1, not '$ROUNDS'" >&2
    exit 2
fi

WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT

say "building novad, novagateway, nova and cold-read (release)"
build_release -p novagateway
start_s3
S3_PID=${PIDS[-1]}
MACHINE=$(machine_line)
if [ "$LATENCY" != 0 ]; then
    "$BIN/delay-proxy" --target "127.0.0.1:$S3_PORT" --delay-ms "$LATENCY" >"$WORK/proxy.addr" &
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    for _ in $(seq 100); do [ -s "$WORK/proxy.addr" ] && break; sleep 0.05; done
    if [ ! -s "$WORK/proxy.addr" ] || ! kill -0 "$PROXY_PID" 2>/dev/null; then
        echo "the delay line (delay-proxy) did not start" >&2
        exit 1
    fi
    ENDPOINT=http://$(head -1 "$WORK/proxy.addr")
fi
if [ "$PIN" = 1 ]; then
    # Every thread of the server (and its delay line) on CPU 0; this script, and so
    # everything it starts from here on, on CPU 1.
    taskset -a -cp 0 "$S3_PID" >/dev/null
    if [ "$LATENCY" != 0 ]; then taskset -a -cp 0 "$PROXY_PID" >/dev/null; fi
    taskset -cp 1 $$ >/dev/null
fi
"$BIN/raw-put" --endpoint "$ENDPOINT" --bucket nova --create-bucket --duration 0s
S3=(--s3-bucket nova --s3-endpoint "$ENDPOINT" --s3-path-style)

NOVA_PORT=$(free_port)
# No auditor: the raw mode reads the flights' sections, which settling would move away.
"$BIN/novad" --data-dir "$WORK/novad" --listen "127.0.0.1:$NOVA_PORT" --metrics-addr "127.0.0.1:$(free_port)" \
    "${S3[@]}" --tail-window-cache-mib 1 --auditor false >"$WORK/novad.log" 2>&1 &
STAR_PID=$!
PIDS+=("$STAR_PID")
wait_port "$NOVA_PORT"
# Starts a gateway with FLAGS on fresh ports (GW_PID, GW_PORT, GW_METRICS).
start_gateway() {
    GW_PORT=$(free_port)
    GW_METRICS=$(free_port)
    "$BIN/novagateway" --listen "127.0.0.1:$GW_PORT" --metrics-addr "127.0.0.1:$GW_METRICS" \
        --star "http://127.0.0.1:$NOVA_PORT" "${S3[@]}" "$@" >>"$WORK/gateway.log" 2>&1 &
    GW_PID=$!
    PIDS+=("$GW_PID")
    wait_port "$GW_PORT"
}
start_gateway

say "loading $BYTES over 16 streams"
"$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" --output json bench --reuse-streams --sessions 16 --record-bytes 4KiB \
    --batch-records 64 --bytes "$BYTES" --quiet >"$WORK/load.json"
# The last object of that load: every raw pass reads up to it, so none reads the filler.
"$BIN/cold-read" raw --endpoint "$ENDPOINT" --bucket nova --concurrency 64 >"$WORK/listed.json"
LAST_KEY=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["last_key"])' "$WORK/listed.json")
RAW=("$BIN/cold-read" raw --endpoint "$ENDPOINT" --bucket nova --concurrency 64 --through-key "$LAST_KEY")
say "loading $FILLER_BYTES over 16 other streams, to fill a gateway's object cache with"
"$BIN/nova" --server "http://127.0.0.1:$NOVA_PORT" --output json bench --reuse-streams --sessions 16 --record-bytes 4KiB \
    --batch-records 64 --bytes "$FILLER_BYTES" --stream-prefix filler --quiet >"$WORK/filler.json"

# Runs a read pass (its JSON into WORK/NAME.json) and notes the CPU seconds of the
# S3-compatible server and of the serving process PID before and after it (WORK/NAME.cpu:
# server before, after, serving before, after).
pass_of() {
    local name=$1 pid=$2 s0 p0
    shift 2
    s0=$(cpu_of "$S3_PID")
    p0=$(cpu_of "$pid")
    "$@" >"$WORK/$name.json"
    echo "$s0 $(cpu_of "$S3_PID") $p0 $(cpu_of "$pid")" >"$WORK/$name.cpu"
}

# The read floor: every stream's sections learnt once, then only fetched and sent on.
FLOOR_PORT=$(free_port)
"$BIN/relay" --endpoint "$ENDPOINT" --bucket nova --listen "127.0.0.1:$FLOOR_PORT" \
    --star "http://127.0.0.1:$NOVA_PORT" --streams 16 >"$WORK/relay.log" 2>&1 &
FLOOR_PID=$!
PIDS+=("$FLOOR_PID")
wait_port "$FLOOR_PORT" || { cat "$WORK/relay.log" >&2; exit 1; }

AHEAD=(--read-ahead-bytes "$AHEAD_BYTES")
# A round's five reads of every stream, 8 readers each: through a fresh gateway (cold
# caches), through a gateway in service (service_pass, below), through a fresh gateway with
# read-ahead, and through the read floor without and with its windows kept full across pages. Only one gateway runs at a time: in probes, a
# gateway read while another (idle) one was still up spent a quarter more CPU per MiB (2.61
# against 2.03 to 2.16 ms), for no reason found.
fresh_gateway() {
    if [ -n "$GW_PID" ]; then stop_pid "$GW_PID"; fi
    start_gateway "$@"
}
cold_pass() {
    fresh_gateway
    say "round $1 of $ROUNDS: every stream through a fresh gateway (cold caches)"
    pass_of "cold_$1" "$GW_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8
    save_page "http://127.0.0.1:$GW_METRICS/metrics" "$WORK/cold_$1.metrics"
}
ahead_pass() {
    fresh_gateway "${AHEAD[@]}"
    say "round $1 of $ROUNDS: every stream through a fresh gateway with read-ahead (cold caches)"
    pass_of "ahead_$1" "$GW_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8
    save_page "http://127.0.0.1:$GW_METRICS/metrics" "$WORK/ahead_$1.metrics"
}
# A gateway in service: its object cache first filled with the filler streams (not timed; read
# twice, since a range is cached from its second request), then every measured stream read,
# cold for this gateway.
service_pass() {
    fresh_gateway
    say "round $1 of $ROUNDS: every stream through a gateway in service (its object cache full of other streams)"
    for _ in 1 2; do
        "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --stream-prefix filler --readers 8 >"$WORK/filled_$1.json"
    done
    save_page "http://127.0.0.1:$GW_METRICS/metrics" "$WORK/filled_$1.metrics"
    pass_of "service_$1" "$GW_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8
    save_page "http://127.0.0.1:$GW_METRICS/metrics" "$WORK/service_$1.metrics"
}
floor_pass() {
    if [ -n "$GW_PID" ]; then stop_pid "$GW_PID"; GW_PID=; fi
    say "round $1 of $ROUNDS: every stream through the read floor"
    pass_of "floor_$1" "$FLOOR_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$FLOOR_PORT" --streams 16 --readers 8
}
# The read floor with each stream's window of GETs kept full across pages (--cursor-sections).
cursor_pass() {
    if [ -n "$GW_PID" ]; then stop_pid "$GW_PID"; GW_PID=; fi
    local port pid
    port=$(free_port)
    "$BIN/relay" --endpoint "$ENDPOINT" --bucket nova --listen "127.0.0.1:$port" \
        --star "http://127.0.0.1:$NOVA_PORT" --streams 16 --cursor-sections 24 >>"$WORK/relay.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$port" || { cat "$WORK/relay.log" >&2; exit 1; }
    say "round $1 of $ROUNDS: every stream through the read floor, its windows kept full across pages"
    pass_of "cursor_$1" "$pid" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$port" --streams 16 --readers 8
    stop_pid "$pid"
}

# Rounds of the five reads alternate with raw passes (raw_0, round 1, raw_1, ..., round N,
# raw_N): each read is divided by the raw passes either side of its round, as this shared
# machine drifts by a fifth between passes a minute apart. The five take turns going first.
ORDERS=("cold service floor ahead cursor" "service floor ahead cursor cold" "floor ahead cursor cold service"
    "ahead cursor cold service floor" "cursor cold service floor ahead")
say "raw ranged GETs of every section, 64 at a time"
pass_of raw_0 "$STAR_PID" "${RAW[@]}"
for round in $(seq "$ROUNDS"); do
    for read in ${ORDERS[$(((round - 1) % 5))]}; do
        "${read}_pass" "$round"
    done
    say "raw ranged GETs again"
    pass_of "raw_$round" "$STAR_PID" "${RAW[@]}"
done
if [ -n "$GW_PID" ]; then stop_pid "$GW_PID"; GW_PID=; fi
say "every stream from the star, 8 readers"
pass_of star "$STAR_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$NOVA_PORT" --streams 16 --readers 8
# The warm pass: a fresh gateway reads everything twice (not measured: a range is cached from
# its second request), then again.
fresh_gateway
say "warm caches: every stream through a fresh gateway three times, the third time measured"
for _ in 1 2; do
    "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8 >"$WORK/prime.json"
done
save_page "http://127.0.0.1:$GW_METRICS/metrics" "$WORK/prime.metrics"
pass_of warm "$GW_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8
save_page "http://127.0.0.1:$GW_METRICS/metrics" "$WORK/warm.metrics"
stop_pid "$GW_PID"
start_gateway
say "the same, readers spending 20 ms on each page, without read-ahead (cold caches)"
pass_of think "$GW_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8 --think-ms 20
stop_pid "$GW_PID"
start_gateway "${AHEAD[@]}"
say "and with read-ahead (cold caches)"
pass_of think_ahead "$GW_PID" "$BIN/cold-read" gateway --gateway "http://127.0.0.1:$GW_PORT" --streams 16 --readers 8 --think-ms 20
save_page "http://127.0.0.1:$GW_METRICS/metrics" "$WORK/think_ahead.metrics"

python3 - "$WORK" "$BYTES" "$MACHINE" "$(git rev-parse --short HEAD)" "$PIN" "$LATENCY" "$ROUNDS" "$AHEAD_BYTES" <<'PY'
import datetime, json, sys
work, loaded, machine, commit, pin, latency, rounds, ahead_bytes = sys.argv[1:]
rounds = int(rounds)
def series(page, name):
    """The sum of every series of metric `name` on a saved metrics page."""
    return sum(float(l.rsplit(" ", 1)[1]) for l in open(f"{work}/{page}.metrics")
               if l.split("{")[0].split(" ")[0] == name)
def series_where(page, name, label):
    """The series of `name` with `label` on a saved metrics page."""
    return sum(float(l.rsplit(" ", 1)[1]) for l in open(f"{work}/{page}.metrics")
               if l.startswith(name + "{") and label in l)
def load(name):
    run = json.load(open(f"{work}/{name}.json"))
    s0, s1, p0, p1 = map(float, open(f"{work}/{name}.cpu").read().split())
    server, serving = s1 - s0, p1 - p0
    mib = run["bytes"] / (1 << 20)
    run["server_ms"], run["serving_ms"] = server * 1000 / mib, serving * 1000 / mib
    return run
star, warm, think, think_ahead = map(load, ("star", "warm", "think", "think_ahead"))
raws = [load(f"raw_{i}") for i in range(rounds + 1)]
colds = [load(f"cold_{i}") for i in range(1, rounds + 1)]
floors = [load(f"floor_{i}") for i in range(1, rounds + 1)]
aheads = [load(f"ahead_{i}") for i in range(1, rounds + 1)]
cursors = [load(f"cursor_{i}") for i in range(1, rounds + 1)]
services = [load(f"service_{i}") for i in range(1, rounds + 1)]
# Each round against the raw passes either side of it; the row is the median round's.
for i in range(rounds):
    for name, run in (("read floor", floors[i]), ("read floor with windows kept full", cursors[i]),
                      ("gateway with read-ahead", aheads[i]), ("gateway in service", services[i])):
        if run["records"] != colds[i]["records"]:
            sys.exit(f"round {i + 1}: the {name} served {run['records']} records, "
                     f"the gateway {colds[i]['records']}: they must read the same")
    for run in (colds[i], floors[i], aheads[i], cursors[i], services[i]):
        run["ratio"] = run["mib_per_sec"] / ((raws[i]["mib_per_sec"] + raws[i + 1]["mib_per_sec"]) / 2)
    colds[i]["of_floor"] = colds[i]["mib_per_sec"] / floors[i]["mib_per_sec"]
def median(runs, key):
    """The median run by `key` (with an even number, the lower of the middle two)."""
    return sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]
cold, floor, ahead_run, cursor, service = (median(runs, "ratio") for runs in (colds, floors, aheads, cursors, services))
# The raw passes as one row: their mean throughput and CPU per MiB. The other rows (read
# once, not in rounds) are divided by it.
raw = dict(raws[0])
for key in ("mib_per_sec", "server_ms", "cpu_ms_per_mib"):
    raw[key] = sum(r[key] for r in raws) / len(raws)
raw["serving_ms"] = 0.0
def row(label, run, serving):
    total = run["server_ms"] + run["serving_ms"] + run["cpu_ms_per_mib"]
    serving_cell = f"{run['serving_ms']:.2f} ms" if serving else "—"
    ratio = run.get("ratio", run["mib_per_sec"] / raw["mib_per_sec"])
    return (f"| {label} | {run['mib_per_sec']:.1f} | {ratio:.2f} | "
            f"{run['server_ms']:.2f} ms | {serving_cell} | {run['cpu_ms_per_mib']:.2f} ms | {total:.2f} ms |")
hc, mc = (series("cold_1", f"nova_gateway_footer_cache_{kind}_total") for kind in ("hits", "misses"))
hp, mp = (series("prime", f"nova_gateway_footer_cache_{kind}_total") for kind in ("hits", "misses"))
h, m = (series("warm", f"nova_gateway_footer_cache_{kind}_total") for kind in ("hits", "misses"))
peak = series("warm", "nova_gateway_fetch_pool_peak_bytes")
# The gateway in service: how full its object cache was when the timed read began, and how
# much of that read the cache answered (for the read to be cold, only sections two of its pages
# share: the first page's kept, the next's hit).
def between(name, i):
    return series(f"service_{i}", name) - series(f"filled_{i}", name)
filled = min(series(f"filled_{i}", "nova_gateway_object_cache_used_bytes") for i in range(1, rounds + 1))
capacity = series("filled_1", "nova_gateway_object_cache_capacity_bytes")
service_hits = sum(between("nova_gateway_object_cache_hits_total", i) for i in range(1, rounds + 1))
service_misses = sum(between("nova_gateway_object_cache_misses_total", i) for i in range(1, rounds + 1))
def outcomes(page):
    counts = {o: int(series_where(page, "nova_gateway_read_aheads_total", f'outcome="{o}"'))
              for o in ("used", "no_room", "hot", "expired", "outdated", "failed", "cap")}
    return ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "none"
lines = [
    f"Measured {datetime.date.today()} on {machine}, commit {commit}. Server: s3s-fs 0.14.1"
    + (" on CPU 0, everything else on CPU 1" if pin == "1" else ", sharing both cores")
    + (f", behind a delay line of {latency} ms each way. " if latency != "0" else ". ") +
    f"Loaded {loaded} of 4 KiB records over 16 streams into a star with a 1 MiB tail cache.",
    "",
    "| reading | MiB/s | ÷ raw | S3 server CPU per MiB | star or gateway CPU per MiB | reader CPU per MiB | all three |",
    "|---|---|---|---|---|---|---|",
    row(f"raw ranged GETs, 64 at a time ({raw['sections']} sections of {raw['objects']} objects; "
        f"the mean of {len(raws)} passes: " + ", ".join(f"{r['mib_per_sec']:.1f}" for r in raws) + ")", raw, False),
    row(f"the read floor (`relay --star`: the gateway's fetch plan, none of its per-read work), 8 readers (the median of {rounds} rounds)", floor, True),
    row(f"the read floor with each stream's window of GETs kept full across pages (`--cursor-sections 24`; the median of {rounds} rounds)", cursor, True),
    row("from the star, 8 readers", star, True),
    row(f"through the gateway, cold caches (the median of {rounds} rounds, each ÷ the raw passes either side)", cold, True),
    row(f"through a gateway in service, cold for these streams: its object cache first filled by reading other streams (the median of {rounds} rounds)", service, True),
    row("through the gateway, warm caches", warm, True),
    row(f"through the gateway, cold caches, read-ahead on (`--read-ahead-bytes {ahead_bytes}`; the median of {rounds} rounds)", ahead_run, True),
    row("through the gateway, cold caches, readers spending 20 ms a page", think, True),
    row("the same, read-ahead on", think_ahead, True),
    "",
    f"The gateway's cold rounds, each ÷ the mean of the raw passes either side: "
    + ", ".join(f"{c['mib_per_sec']:.1f} MiB/s ({c['ratio']:.2f})" for c in colds) + "; "
    f"the read floor's: " + ", ".join(f"{f['mib_per_sec']:.1f} MiB/s ({f['ratio']:.2f})" for f in floors) + "; "
    f"the gateway ÷ the floor in each round: " + ", ".join(f"{c['of_floor']:.2f}" for c in colds)
    + f" (median {median(colds, 'of_floor')['of_floor']:.2f}); with read-ahead on: "
    + ", ".join(f"{a['mib_per_sec']:.1f} MiB/s ({a['ratio']:.2f})" for a in aheads) + "; "
    f"the floor with windows kept full: " + ", ".join(f"{c['mib_per_sec']:.1f} MiB/s ({c['ratio']:.2f})" for c in cursors) + "; "
    f"the gateway in service: " + ", ".join(f"{c['mib_per_sec']:.1f} MiB/s ({c['ratio']:.2f})" for c in services) + ".",
    "",
    f"Footer cache hit rate: {hc / max(hc + mc, 1):.1%} on a cold pass, {(h - hp) / max((h - hp) + (m - mp), 1):.1%} on the warm pass. "
    f"Fetch pool peak: {peak / (1 << 20):.1f} MiB of 64 MiB. "
    f"The gateway in service: its object cache held at least {filled / (1 << 20):.0f} MiB of its {capacity / (1 << 20):.0f} MiB when each timed read began, "
    f"and answered {service_hits / max(service_hits + service_misses, 1):.1%} of that read's ranges. "
    f"Read-aheads with read-ahead on: {outcomes(f'ahead_{rounds}')} on the last round's cold pass, "
    f"{outcomes('think_ahead')} with readers spending 20 ms a page."
    + (" The delay line runs beside the server (on its core when pinned); its CPU is in no column."
       if latency != "0" else ""),
]
table = "\n".join(lines)
print(table)
open(f"{work}/gateway.md", "w").write(table + "\n")
PY
if [ "$UPDATE_DOCS" = 1 ]; then
    if [ "$LATENCY" != 0 ]; then block=gateway-latency
    elif [ "$PIN" = 1 ]; then block=gateway-pinned
    else block=gateway; fi
    update_docs_block "$block" "$WORK/gateway.md"
fi
