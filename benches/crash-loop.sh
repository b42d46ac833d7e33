#!/usr/bin/env bash
# The crash loop: novad on moto server, killed with SIGKILL at random moments while producers
# append, restarted, and checked, cycle after cycle (1,000 by default). Arguments pass through:
#   benches/crash-loop.sh --cycles 1000 --seed 3
# Needs the README's test command to have run once (it installs moto server).
set -euo pipefail
cd "$(dirname "$0")/.."
export NOVA_MOTO_SERVER="${NOVA_MOTO_SERVER:-$PWD/.nova-test/venv/bin/moto_server}"
# The same (debug) profile the tests build, so nothing is compiled twice.
cargo build -q -p novad -p nova-benches --bins
exec target/debug/crash-loop "$@"
