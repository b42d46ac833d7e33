# s2-lite, the nearest open peer, for the scripts that compare against it; sourced after
# lib.sh (it needs ROOT, WORK, PIDS, BIN and a running S3-compatible server at ENDPOINT).
#
# s2-lite comes with the s2 CLI (crates.io `s2-cli`), installed into .nova-test/s2 on first use:
# a long build (about 25 minutes on two cores), once.

S2_VERSION=0.43.4
S2=$ROOT/.nova-test/s2/bin/s2

s2_install() {
    if [ ! -x "$S2" ]; then
        say "installing s2-cli $S2_VERSION (with s2-lite) into .nova-test/s2: a long build, once"
        cargo install -q "s2-cli@$S2_VERSION" --locked --root "$ROOT/.nova-test/s2"
    fi
}

# Runs s2-lite on a fresh bucket of the server and `s2 bench` against it: one stream of 8 KiB
# records at up to TARGET_MIBPS for DURATION. `s2 bench` reads the stream live beside its
# writes, then waits and reads everything back: the server's CPU and peak RSS are taken when it
# starts waiting, so the catch-up read is not counted. Writes WORK/s2.json: MiB/s, ack p50 and
# p99 in ms, the server's CPU ms per MiB written and its peak RSS in MiB.
#
#   s2_bench DURATION TARGET_MIBPS
s2_bench() {
    local duration=$1 target=$2 port lite bench cpu_before cpu_after="" rss=""
    # (Bucket names need at least three characters.)
    "$BIN/raw-put" --endpoint "$ENDPOINT" --bucket s2lite --create-bucket --duration 0s
    port=$(free_port)
    AWS_ENDPOINT_URL_S3=$ENDPOINT S2LITE_NO_DASHBOARD=1 \
        "$S2" lite --bucket s2lite --port "$port" >"$WORK/s2-lite.log" 2>&1 &
    lite=$!
    PIDS+=("$lite")
    wait_port "$port" || { cat "$WORK/s2-lite.log" >&2; return 1; }
    S2_ACCOUNT_ENDPOINT=http://127.0.0.1:$port S2_BASIN_ENDPOINT=http://127.0.0.1:$port \
        S2_ACCESS_TOKEN=unused-by-lite NO_COLOR=1 \
        "$S2" create-basin s2://nova-peer >"$WORK/s2-basin.log" 2>&1 || {
        cat "$WORK/s2-basin.log" >&2
        return 1
    }
    cpu_before=$(cpu_of "$lite")
    S2_ACCOUNT_ENDPOINT=http://127.0.0.1:$port S2_BASIN_ENDPOINT=http://127.0.0.1:$port \
        S2_ACCESS_TOKEN=unused-by-lite NO_COLOR=1 \
        "$S2" bench s2://nova-peer --record-size 8192 --target-mibps "$target" \
        --duration "$duration" --catchup-delay 5s >"$WORK/s2.out" 2>&1 &
    bench=$!
    PIDS+=("$bench")
    while kill -0 "$bench" 2>/dev/null; do
        if [ -z "$cpu_after" ] && grep -q "before catchup read" "$WORK/s2.out"; then
            cpu_after=$(cpu_of "$lite")
            rss=$(peak_rss_of "$lite")
        fi
        sleep 0.2
    done
    wait "$bench" || { cat "$WORK/s2.out" >&2; return 1; }
    stop_pid "$bench"
    if [ -z "$cpu_after" ]; then
        echo "s2 bench never said it was waiting before its catch-up read: its output changed," \
            "and the write phase cannot be told apart" >&2
        return 1
    fi
    stop_pid "$lite"
    python3 - "$WORK/s2.out" "$cpu_before" "$cpu_after" "$rss" >"$WORK/s2.json" <<'PY'
import json, re, sys
path, cpu_before, cpu_after, rss = sys.argv[1:]
out = re.sub(r"\x1b\[[0-9;]*m", "", open(path).read())
write = re.search(r"Write: ([0-9.]+) MiB/s, [0-9.]+ records/s \(([0-9]+) bytes", out)
if not write:
    sys.exit(f"no write figures in s2 bench's output:\n{out}")
mib, written = float(write.group(1)), int(write.group(2))

def latency(name):
    """The ack latency table's row, in ms (the first table s2 bench prints is ack latency)."""
    section = out.split("Ack Latency Statistics", 1)[1]
    match = re.search(rf"{name}\s*:\s*([0-9.]+)\s*(ns|µs|us|ms|s)\b", section)
    if not match:
        sys.exit(f"no ack {name} in s2 bench's output:\n{out}")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"ns": 1e-6, "µs": 0.001, "us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

print(json.dumps({
    "mib_per_sec": mib,
    "p50_ms": latency("p50"),
    "p99_ms": latency("p99"),
    "cpu_ms_per_mib": (float(cpu_after) - float(cpu_before)) * 1000 / (written / (1 << 20)),
    "peak_rss_mib": int(rss) / (1 << 20),
}))
PY
}
