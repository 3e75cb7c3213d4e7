#!/usr/bin/env bash
# The main job on its embedded default. As root (the default when it can):
# a Slurm job and a pod sharing one node's GPUs, for real (slurm_demo below).
# Otherwise, or with --ledger: builds duet-bridge and duetctl, starts the
# bridge with the built-in demo inventory (two 8-GPU H100 nodes, one 4-chip
# TPU v5e host) and shows what it serves (an empty ledger), then stops it.
# Usage: scripts/demo.sh            (root: the sharing; else the ledger, saying why)
#        scripts/demo.sh --slurm    (the sharing, or an error when not root;
#                                    DUET_BUILD_DIR picks its build dir, default build)
#        scripts/demo.sh --ledger [--keep]   (the ledger only; --keep leaves it running)
set -euo pipefail
cd "$(dirname "$0")/.."

# --slurm: a real local Slurm cluster (tests/integration/slurm_cluster.sh:
# munged, slurmctld, one slurmd per node on 127.0.0.N) with spank_duet.so in
# its plugstack, duet-bridge with slurm.enabled creating the Slurm nodes from
# its inventory, a real `sbatch --gres=gpu:2` job, and `duetctl nodes` showing
# the GPUs Slurm holds once the sync imported the job. Then the Kubernetes
# side: a pod asking 2 GPUs is created with kubectl in a fake kube-apiserver
# (tests/fakes/fake_apiserver.py: no real one runs on these machines) and
# scheduled through duet-bridge's scheduler extender with the requests
# kube-scheduler sends (filter, prioritize, bind), so the bind makes its Slurm
# placeholder and `duetctl nodes` shows the Slurm job and the pod sharing one
# node's GPUs. Stops everything it started. Needs root (slurmd, munged, device
# nodes, UTS namespaces).
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
  FAKE=
  # shellcheck disable=SC2317  # called by the EXIT trap
  cleanup() {
    if [[ -n $BRIDGE ]]; then kill "$BRIDGE" 2>/dev/null || true; wait "$BRIDGE" 2>/dev/null || true; fi
    if [[ -n $FAKE ]]; then kill "$FAKE" 2>/dev/null || true; wait "$FAKE" 2>/dev/null || true; fi
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
  # The fake kube-apiserver (real wire protocol) that the extender binds pods
  # in and the pod watch follows, and a kubeconfig for it.
  tests/fakes/fake_apiserver.py --port-file "$STATE/apiserver.port" >"$STATE/apiserver.log" 2>&1 &
  FAKE=$!
  for _ in $(seq 100); do [[ -s $STATE/apiserver.port ]] && break; sleep 0.1; done
  local api_port
  api_port=$(cat "$STATE/apiserver.port")
  cat >"$STATE/kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:$api_port"}}]
users: [{name: demo, user: {token: demo}}]
contexts: [{name: fake, context: {cluster: fake, user: demo, namespace: default}}]
current-context: fake
YAML
  kube() { kubectl --kubeconfig "$STATE/kubeconfig" --cache-dir "$STATE/kubectl-cache" "$@"; }

  cat >"$STATE/bridge.yaml" <<YAML
grpc: {listen: "", unix_socket: $STATE/bridge.sock}
metrics: {listen: ""}
journal: {dir: $STATE/journal}
inventory: {source: file, file: $STATE/nodes.yaml}
slurm: {enabled: true, conf_path: $SLURM_CONF, sync_period: 1s, munge_socket: $ROOT/munge/munge.socket.2}
kubernetes: {kubeconfig: $STATE/kubeconfig}
extender: {listen: "127.0.0.1:0", url_prefix: /duet}
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
  job=$(sbatch --parsable -o /dev/null -w gke-h100-a --gres=gpu:2 --wrap 'sleep 300')
  echo; echo "== sbatch -w gke-h100-a --gres=gpu:2 --wrap 'sleep 300': job $job"
  for _ in $(seq 200); do
    [[ $(squeue -h -j "$job" -o %T) == RUNNING ]] && "$ctl" holds | grep -q "job $job " && break
    sleep 0.1
  done
  squeue -o '%i %T %N %b'
  echo; echo "== duetctl nodes"; "$ctl" nodes
  echo; echo "== duetctl holds"; "$ctl" holds

  pod_demo
}

# The pod half of --slurm: kubectl creates a pod asking 2 GPUs in the fake
# apiserver; curl plays kube-scheduler (a `duet` profile with duet-bridge as
# its extender, nodeCacheCapable) and sends the extender what kube-scheduler
# would: filter and prioritize with ExtenderArgs {Pod, NodeNames}, then bind
# to the best node. The bind makes the pod's Slurm placeholder and POSTs the
# Binding.
pod_demo() {
  local ext_port url
  ext_port=$(sed -n 's/.*extender http port \([0-9]*\).*/\1/p' "$STATE/bridge.log" | head -1)
  [[ -n $ext_port ]] || { echo "no extender port in $STATE/bridge.log" >&2; exit 1; }
  url=http://127.0.0.1:$ext_port/duet
  cat >"$STATE/pod.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: infer-0, namespace: default, labels: {app: infer}}
spec:
  schedulerName: duet
  containers:
  - name: server
    image: vllm/vllm-openai:v0.6.3
    resources:
      limits: {nvidia.com/gpu: 2, cpu: "2", memory: 4Gi}
YAML
  echo; echo "== kubectl create -f pod.yaml (fake kube-apiserver)"
  kube create -f "$STATE/pod.yaml"
  kube get pod infer-0 -o json >"$STATE/pod.json"
  jq '{Pod: ., NodeNames: ["gke-h100-a", "gke-h100-b", "gke-tpu-a"]}' "$STATE/pod.json" >"$STATE/args.json"

  echo; echo "== POST $url/filter"
  curl -sS --fail-with-body -H 'Content-Type: application/json' --data @"$STATE/args.json" "$url/filter" |
    tee "$STATE/filter.json" | jq -c '{NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}'
  jq '{Pod: .Pod, NodeNames: $f[0].NodeNames}' --slurpfile f "$STATE/filter.json" "$STATE/args.json" \
    >"$STATE/args2.json"
  echo; echo "== POST $url/prioritize"
  curl -sS --fail-with-body -H 'Content-Type: application/json' --data @"$STATE/args2.json" \
    "$url/prioritize" | tee "$STATE/prioritize.json" | jq -c .
  local node uid
  node=$(jq -r 'max_by(.Score).Host' "$STATE/prioritize.json")
  uid=$(jq -r .metadata.uid "$STATE/pod.json")
  echo; echo "== POST $url/bind (to $node, the best score)"
  jq -n --arg node "$node" --arg uid "$uid" \
    '{PodName: "infer-0", PodNamespace: "default", PodUID: $uid, Node: $node}' |
    curl -sS --fail-with-body -H 'Content-Type: application/json' --data @- "$url/bind" | jq -c .

  echo; echo "== kubectl get pod infer-0 (bound by the extender)"
  kube get pod infer-0 -o jsonpath='{.metadata.name} -> {.spec.nodeName}{"\n"}'
  echo; echo "== squeue (the pod's placeholder is a Slurm job)"; squeue -o '%i %j %T %N %b'
  echo; echo "== duetctl nodes (a Slurm job and a pod on $node's GPUs)"; "$ctl" nodes
  echo; echo "== duetctl holds"; "$ctl" holds
}

if [[ "${1:-}" == "--slurm" ]]; then slurm_demo; exit 0; fi
if [[ -z "${1:-}" ]]; then
  if [[ $(id -u) -eq 0 ]]; then slurm_demo; exit 0; fi
  echo "scripts/demo.sh: not root, so no local Slurm cluster: showing duet-bridge's ledger on its"
  echo "embedded inventory only (no Slurm job, no pod). Run it as root to see a Slurm job and a"
  echo "pod share one node's GPUs."
  echo
fi
if [[ "${1:-}" == "--ledger" ]]; then shift; fi

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
