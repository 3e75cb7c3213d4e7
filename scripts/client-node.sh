#!/usr/bin/env bash
# Installs @kubernetes/client-node (the third real client the fake apiserver is
# checked with, tests/k8s_adapter/client_node_test.mjs) from the npm registry into a
# cache outside the clone (DUET_TOOLS_DIR, default ~/.cache/duet/tools), with
# the exact tree of tests/k8s_adapter/client_node/package-lock.json (npm ci).
# Prints one line, `node_modules=PATH`. Idempotent: a second run with the same
# lock file touches nothing and needs no network.
#   scripts/client-node.sh            install what is missing, print the path
#   scripts/client-node.sh --offline  print the path; fail if it is missing
# Needs node and npm (scripts/deps.sh).
set -euo pipefail

offline=0
if [[ ${1:-} == --offline ]]; then offline=1; fi

repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${DUET_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/duet/tools}
lock=$repo/tests/k8s_adapter/client_node/package-lock.json
lock_id=$(sha256sum "$lock" | cut -c1-16)
dir=$tools/client-node-$lock_id

if [[ ! -f $dir/.complete ]]; then
  if [[ $offline == 1 ]]; then
    echo "scripts/client-node.sh: @kubernetes/client-node is not installed under $tools; run scripts/client-node.sh (needs npm and the npm registry)" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$repo/tests/k8s_adapter/client_node/package.json" "$lock" "$dir/"
  (cd "$dir" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$dir/.complete"
fi

echo "node_modules=$dir/node_modules"
