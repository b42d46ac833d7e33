#!/usr/bin/env bash
# The outage soak: 1,000 producer sessions, a five-minute object-store outage, and novad's peak
# resident memory reported against its closed formula plus the stated fixed overhead.
# Arguments pass through, for example: benches/outage-soak.sh --sessions 2000 --outage-secs 600
# Needs the README's test command to have run once (it installs moto server).
set -euo pipefail
cd "$(dirname "$0")/.."
export NOVA_MOTO_SERVER="${NOVA_MOTO_SERVER:-$PWD/.nova-test/venv/bin/moto_server}"
# The same (debug) profile the tests build, so nothing is compiled twice.
cargo build -q -p novad -p nova-benches --bins
exec target/debug/outage-soak "$@"
