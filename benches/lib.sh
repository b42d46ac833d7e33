# Helpers for the bench scripts, sourced (not run): logging, ports, the release build, the
# S3-compatible server, reading a metric, updating the docs' tables, clean-up of everything
# started. The caller sets ROOT (the repository) and WORK (a scratch
# directory) and keeps process ids in PIDS.

say() { printf '==> %s\n' "$*" >&2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() {
    for _ in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "nothing listens on $1" >&2
    return 1
}

# Stops everything in PIDS and removes WORK, or keeps it (with its logs) when the script
# failed; install with `trap cleanup EXIT`.
cleanup() {
    local rc=$?
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$rc" -eq 0 ]; then
        rm -rf "$WORK"
    else
        echo "failed: the logs are kept in $WORK" >&2
    fi
}

# Stops one process started by the script, waits for it to exit and forgets it, so that the
# clean-up never signals a process id the system may since have reused.
stop_pid() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    local kept=() pid
    for pid in "${PIDS[@]}"; do [ "$pid" = "$1" ] || kept+=("$pid"); done
    PIDS=("${kept[@]}")
}

# Builds novad, nova and the bench binaries in release, and any further packages named
# (`build_release -p novagateway`). Sets BIN.
build_release() {
    say "building novad, nova and the bench binaries (release)"
    cargo build -q --release -p novad -p nova-client -p nova-benches "$@" --bins
    BIN=$ROOT/target/release
}

# The S3-compatible server the scripts run against: s3s-fs 0.14.1 (fast, disk-backed; the
# default) or, with SERVER=moto, moto server 5.2.5 (the correctness server, in memory). Every
# client uses the same test credentials.
SERVER=${SERVER:-s3s-fs}
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=testtest AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true

# Starts one such server on a free port (s3s-fs serving WORK/NAME; installed into
# .nova-test/s3s on first use). Sets S3_PORT, ENDPOINT and SERVER_NOTE. (Not to be called in
# $(...): the subshell would lose the pid added to PIDS, and the clean-up would never stop it.)
start_s3() {
    local name=${1:-s3}
    S3_PORT=$(free_port)
    if [ "$SERVER" = moto ]; then
        local moto=${NOVA_MOTO_SERVER:-$ROOT/.nova-test/venv/bin/moto_server}
        "$moto" -H 127.0.0.1 -p "$S3_PORT" >"$WORK/$name.log" 2>&1 &
        SERVER_NOTE="moto server 5.2.5 (in memory)"
    else
        local s3s=$ROOT/.nova-test/s3s/bin/s3s-fs
        if [ ! -x "$s3s" ]; then
            say "installing s3s-fs 0.14.1 into .nova-test/s3s (a few minutes, once)"
            cargo install -q s3s-fs@0.14.1 --features binary --locked --root "$ROOT/.nova-test/s3s"
        fi
        mkdir -p "$WORK/$name"
        "$s3s" --host 127.0.0.1 --port "$S3_PORT" --access-key test --secret-key testtest "$WORK/$name" >"$WORK/$name.log" 2>&1 &
        SERVER_NOTE="s3s-fs 0.14.1 (disk-backed, $WORK)"
    fi
    PIDS+=($!)
    wait_port "$S3_PORT"
    ENDPOINT=http://127.0.0.1:$S3_PORT
}

# Frees the disk a bucket of the s3s-fs server uses (a row's objects are not needed after it is
# measured, and rows of a few GiB each would fill a small disk); nothing for moto, in memory.
drop_bucket() {
    if [ "$SERVER" != moto ]; then rm -rf "${WORK:?}/${1:?}/${2:?}"; fi
}

# The sum of every series of metric NAME (all its label sets) on the metrics page at URL.
metric() {
    python3 -c "import urllib.request,sys; page=urllib.request.urlopen(sys.argv[1]).read().decode(); print(sum(float(l.rsplit(' ',1)[1]) for l in page.splitlines() if l.split('{')[0].split(' ')[0] == sys.argv[2]))" "$1" "$2"
}

# Saves the metrics page at URL to FILE, to read several series from one fetch.
save_page() {
    python3 -c "import urllib.request,sys; open(sys.argv[2], 'w').write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1" "$2"
}

# CPU seconds (user + system) a process has used so far.
cpu_of() { python3 -c "import os,sys; f=open(f'/proc/{sys.argv[1]}/stat').read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))" "$1"; }

# A process's peak resident set, in bytes.
peak_rss_of() { awk '/^VmHWM:/ { print $2 * 1024 }' "/proc/$1/status"; }

# Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in
# docs/performance.md with the contents of FILE.
update_docs_block() {
    python3 - "$1" "$2" <<'PY'
import sys
name, table = sys.argv[1], open(sys.argv[2]).read().rstrip("\n")
path = "docs/performance.md"
text = open(path).read()
begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(path, "w").write(f"{head}{begin}\n{table}\n{end}{tail}")
PY
    say "updated the $1 table in docs/performance.md"
}

# One line naming the machine, for the tables.
machine_line() {
    printf '%s cores (%s), %s %s' "$(nproc)" \
        "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" "$(uname -s)" "$(uname -r)"
}
