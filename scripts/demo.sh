#!/usr/bin/env bash
# The main job on its embedded default: builds duet-bridge and duetctl, starts
# the bridge with the built-in demo inventory (two 8-GPU H100 nodes, one
# 4-chip TPU v5e host) and shows what it serves, then stops it.
# Usage: scripts/demo.sh [--keep]   (--keep leaves the bridge running)
#        scripts/demo.sh --slurm    (the Slurm side, see slurm_demo below;
#                                    DUET_BUILD_DIR picks its build dir, default build)
set -euo pipefail
cd "$(dirname "$0")/.."

# --slurm: a real local Slurm cluster (tests/integration/slurm_cluster.sh:
# munged, slurmctld, one slurmd per node on 127.0.0.N) with spank_duet.so in
# its plugstack, duet-bridge with slurm.enabled creating the Slurm nodes from
# its inventory, a real `sbatch --gres=gpu:2` job, and `duetctl nodes` showing
# the GPUs Slurm holds once the sync imported the job. Stops everything it
# started. Needs root (slurmd, munged, device nodes, UTS namespaces).
slurm_demo() {
  if [[ $(id -u) -ne 0 ]]; then echo "scripts/demo.sh --slurm must run as root" >&2; exit 1; fi
  local build
  build=$(realpath -m "${DUET_BUILD_DIR:-build}")
  scripts/deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" --target duet-bridge duetctl spank_duet

  # Globals: the EXIT trap reads them after this function returned.
  HARNESS=$PWD/tests/integration/slurm_cluster.sh
  local so=$build/slurm_plugin/spank_duet.so
  local ctl=$build/duetctl/duetctl
  STATE=$(mktemp -d /tmp/duet-demo.XXXXXX)
  export DUET_SERVER=unix://$STATE/bridge.sock
  ROOT=$("$HARNESS" init --lifetime 600 --spank "$so:bridge=$DUET_SERVER timeout_ms=2000 munge_socket=@ROOT@/munge/munge.socket.2")
  BRIDGE=
  # shellcheck disable=SC2317  # called by the EXIT trap
  cleanup() {
    if [[ -n $BRIDGE ]]; then kill "$BRIDGE" 2>/dev/null || true; wait "$BRIDGE" 2>/dev/null || true; fi
    "$HARNESS" stop "$ROOT" || true
    echo "logs: $STATE/bridge.log, $ROOT/log/"
  }
  trap cleanup EXIT
  "$HARNESS" start "$ROOT"
  export SLURM_CONF=$ROOT/etc/slurm.conf

  # Two 8-GPU H100 nodes and a 4-chip TPU v5e host; the label tells duet-bridge
  # the NodeAddr of each node's slurmd.
  cat >"$STATE/nodes.yaml" <<YAML
nodes:
  - {name: gke-h100-a, cpus: 8, memory_mib: 16000, pool: shared-h100, zone: us-central1-a,
     labels: {duet.dev/slurm-node-addr: 127.0.0.51, cloud.google.com/gke-accelerator: nvidia-h100-80gb},
     gpus: {count: 8, model: nvidia-h100-80gb}}
  - {name: gke-h100-b, cpus: 8, memory_mib: 16000, pool: shared-h100, zone: us-central1-a,
     labels: {duet.dev/slurm-node-addr: 127.0.0.52, cloud.google.com/gke-accelerator: nvidia-h100-80gb},
     gpus: {count: 8, model: nvidia-h100-80gb}}
  - {name: gke-tpu-a, cpus: 8, memory_mib: 16000, pool: shared-v5e, zone: us-central1-b,
     labels: {duet.dev/slurm-node-addr: 127.0.0.53, cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice},
     tpus: {count: 4, model: tpu-v5-lite-podslice, host_bounds: 2x2, topology: 2x2}}
YAML
  cat >"$STATE/bridge.yaml" <<YAML
grpc: {listen: "", unix_socket: $STATE/bridge.sock}
metrics: {listen: ""}
journal: {dir: $STATE/journal}
inventory: {source: file, file: $STATE/nodes.yaml}
slurm: {enabled: true, conf_path: $SLURM_CONF, sync_period: 1s, munge_socket: $ROOT/munge/munge.socket.2}
YAML
  "$build/bridge/server/duet-bridge" --config "$STATE/bridge.yaml" >"$STATE/bridge.log" 2>&1 &
  BRIDGE=$!
  for _ in $(seq 100); do [[ -S $STATE/bridge.sock ]] && break; sleep 0.1; done
  [[ -S $STATE/bridge.sock ]] || { cat "$STATE/bridge.log"; exit 1; }

  # duet-bridge created the Slurm nodes (State=FUTURE); start their slurmds.
  local gpu='Name=gpu Type=nvidia-h100-80gb File='$ROOT'/dev/nvidia[0-7]'
  local tpu='Name=tpu Type=tpu-v5-lite-podslice File='$ROOT'/dev/accel[0-3]'
  "$HARNESS" slurmd "$ROOT" gke-h100-a 51 "CPUs=8 RealMemory=16000 Gres=gpu:nvidia-h100-80gb:8" "$gpu"
  "$HARNESS" slurmd "$ROOT" gke-h100-b 52 "CPUs=8 RealMemory=16000 Gres=gpu:nvidia-h100-80gb:8" "$gpu"
  "$HARNESS" slurmd "$ROOT" gke-tpu-a 53 "CPUs=8 RealMemory=16000 Gres=tpu:tpu-v5-lite-podslice:4" "$tpu"
  for _ in $(seq 300); do
    [[ $(sinfo -h -N -t idle -o %N | wc -l) -eq 3 ]] && break; sleep 0.1
  done
  echo "== duet-bridge log"; cat "$STATE/bridge.log"
  echo; echo "== sinfo (nodes created by duet-bridge)"; sinfo -N -o '%N %t %G %f'

  local job
  job=$(sbatch --parsable -o /dev/null --gres=gpu:2 --wrap 'sleep 120')
  echo; echo "== sbatch --gres=gpu:2 --wrap 'sleep 120': job $job"
  for _ in $(seq 200); do
    [[ $(squeue -h -j "$job" -o %T) == RUNNING ]] && "$ctl" holds | grep -q "job $job " && break
    sleep 0.1
  done
  squeue -o '%i %T %N %b'
  echo; echo "== duetctl nodes"; "$ctl" nodes
  echo; echo "== duetctl holds"; "$ctl" holds
}

if [[ "${1:-}" == "--slurm" ]]; then slurm_demo; exit 0; fi

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
