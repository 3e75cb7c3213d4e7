#!/usr/bin/env bash
# Builds duet and runs every test: unit tests, the daemon end to end, kill -9
# recovery, the real Slurm cluster tests, and a brief run of each benchmark.
# Usage: scripts/test.sh [extra ctest args, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure --timeout 900 "$@"
