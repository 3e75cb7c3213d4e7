#!/usr/bin/env bash
# The main job on its embedded default: builds duet-bridge and duetctl, starts
# the bridge with the built-in demo inventory (two 8-GPU H100 nodes, one
# 4-chip TPU v5e host) and shows what it serves, then stops it.
# Usage: scripts/demo.sh [--keep]   (--keep leaves the bridge running)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target duet-bridge duetctl

STATE=$(mktemp -d /tmp/duet-demo.XXXXXX)
export DUET_SERVER=unix://$STATE/bridge.sock
build/bridge/server/duet-bridge --dev --state-dir "$STATE" --grpc-listen "" \
  --metrics-listen 127.0.0.1:0 >"$STATE/bridge.log" 2>&1 &
BRIDGE=$!
if [[ "${1:-}" != "--keep" ]]; then trap 'kill $BRIDGE; wait $BRIDGE 2>/dev/null || true' EXIT; fi
for _ in $(seq 50); do [[ -S $STATE/bridge.sock ]] && break; sleep 0.1; done

echo "== duet-bridge log"; cat "$STATE/bridge.log"
echo; echo "== duetctl nodes"; build/duetctl/duetctl nodes
echo; echo "== duetctl holds"; build/duetctl/duetctl holds
echo; echo "== duetctl node gke-tpu-a"; build/duetctl/duetctl node gke-tpu-a
if [[ "${1:-}" == "--keep" ]]; then
  echo; echo "duet-bridge keeps running (pid $BRIDGE); DUET_SERVER=$DUET_SERVER"
fi
