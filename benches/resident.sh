#!/usr/bin/env bash
# Resident memory under Nova's tuned glibc, glibc untuned, jemalloc and mimalloc, side by side:
# 200 cold readers of 8 MiB pages, and object-store outages under 200 and 4,096 producer
# sessions. About 20 minutes. Arguments pass through (--readers, --outage-secs,
# --many-sessions). Needs the README's test command to have run once (moto server), and
# Debian's libjemalloc2 and libmimalloc2.0 for the preloaded variants (installed here if
# missing, as root).
set -euo pipefail
cd "$(dirname "$0")/.."
export NOVA_MOTO_SERVER="${NOVA_MOTO_SERVER:-$PWD/.nova-test/venv/bin/moto_server}"
if [ "$(id -u)" = 0 ] && ! [ -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ]; then
    apt-get install -y -q --no-install-recommends libjemalloc2 libmimalloc2.0 >/dev/null
fi
# The same (debug) profile the tests build, so nothing is compiled twice.
cargo build -q -p novad -p nova-benches --bins
exec target/debug/resident "$@"
