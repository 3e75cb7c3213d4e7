#!/bin/bash
# bench/slurm/run_pod_rate.sh [--quick] POD_RATE_BENCH [ARGS...]
#
# Pods per second through duet, end to end (pod_rate_bench.cc): a private
# Slurm cluster (tests/integration/slurm_cluster.sh) of $NODES nodes with
# $GPUS GPUs each (one slurmd per node; the GPUs are device files under the
# cluster's root), then pod_rate_bench over them with the ledger-only, the
# Slurm placeholder and the libslurm-only configurations side by side.
# ARGS go to pod_rate_bench after --nodes/--gpus (e.g. --pods 100,1000
# --reps 3 --clients 16 --bind-threads 16). --quick: 2 nodes x 16 GPUs,
# 10 pods, one rep (the ctest smoke run).
set -euo pipefail
quick=0
if [[ ${1:-} == --quick ]]; then quick=1; shift; fi
TOOL=$(readlink -f "$1"); shift
HERE=$(cd "$(dirname "$0")" && pwd)
CL=$HERE/../../tests/integration/slurm_cluster.sh
if ((quick)); then NODES=2; GPUS=16; else NODES=${NODES:-8}; GPUS=${GPUS:-128}; fi

ROOT=$("$CL" init --max-nodes $((NODES + 8)) --lifetime 1800)
export SLURM_CONF=$ROOT/etc/slurm.conf
trap '"$CL" stop "$ROOT" || true' EXIT
# slurm_cluster.sh makes nvidia0..7; gres/gpu wants a device file per GPU.
for ((i = 8; i < GPUS; i++)); do mknod "$ROOT/dev/nvidia$i" c 195 "$i"; done
"$CL" start "$ROOT"
names=()
for ((n = 0; n < NODES; n++)); do
  name=pr$n; names+=("$name")
  # One CPU and DefMemPerCPU (100 MiB) per placeholder.
  attrs="CPUs=$GPUS RealMemory=$((100 * GPUS + 1024)) Gres=gpu:h100:$GPUS"
  "$CL" create "$ROOT" "$name" $((20 + n)) "$attrs Feature=bench" >/dev/null
  "$CL" slurmd "$ROOT" "$name" $((20 + n)) "$attrs" \
    "Name=gpu Type=h100 File=$ROOT/dev/nvidia[0-$((GPUS - 1))]"
done
for name in "${names[@]}"; do
  for ((i = 0; i < 600; i++)); do
    scontrol show node "$name" 2>/dev/null | grep -qE 'State=IDLE(\+DYNAMIC_NORM)? ' && break
    sleep 0.05
  done
  ((i < 600)) || { echo "node $name did not come up" >&2; exit 1; }
done
nodes=$(IFS=,; echo "${names[*]}")
export DUET_BENCH_CTLD_PID=$(cat "$ROOT/run/slurmctld.bgpid")  # its CPU time per pod
if ((quick)); then
  "$TOOL" --nodes "$nodes" --gpus "$GPUS" --pods 10 --reps 1 --clients 4 "$@"
else
  "$TOOL" --nodes "$nodes" --gpus "$GPUS" "$@"
fi
