#!/usr/bin/env bash
# Installs what duet needs (scripts/deps.sh, helm and @kubernetes/client-node
# from npm) and builds everything in build/ with Ninja: the first half of
# scripts/test.sh, which runs the tests after it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# helm and the chart's schema validators (npm, pinned; cached outside the clone).
scripts/helm.sh >/dev/null
# @kubernetes/client-node for tests/k8s_adapter/client_node_test.mjs (npm, pinned; same cache).
scripts/client-node.sh >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_WERROR=ON
cmake --build build
