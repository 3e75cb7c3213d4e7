#!/usr/bin/env bash
# The main job on its embedded default. As root (the default when it can):
# a Slurm job and a pod sharing one node's GPUs, for real (slurm_demo below).
# Otherwise, or with --ledger: builds duet-bridge and duetctl, starts the
# bridge with the built-in demo inventory (two 8-GPU H100 nodes, one 4-chip
# TPU v5e host) and shows what it serves (an empty ledger), then stops it.
# Usage: scripts/demo.sh            (root: the sharing; else the ledger, saying why)
#        scripts/demo.sh --slurm    (the sharing, or an error when not root;
#                                    DUET_BUILD_DIR picks its build dir, default build)
#        scripts/demo.sh --dra      (the DRA lending mode, docs/dra.md: a Slurm job and a
#                                    pod that names no schedulerName, placed by a stand-in
#                                    for kube-scheduler, on one node's GPUs (dra_demo
#                                    below); root only; DUET_BUILD_DIR as for --slurm)
#        scripts/demo.sh --ledger [--keep]   (the ledger only; --keep leaves it running)
set -euo pipefail
cd "$(dirname "$0")/.."

# The set-up --slurm and --dra share. Globals (the EXIT trap reads them):
# BUILD, CTL, HARNESS, STATE, ROOT (the Slurm cluster's), BRIDGE, FAKE and
# SCHED (the processes started, by pid).
BRIDGE=
FAKE=
SCHED=

# Builds what a real-Slurm demo runs, as root only ($1: the mode, for the error).
demo_build() {
  if [[ $(id -u) -ne 0 ]]; then echo "scripts/demo.sh $1 must run as root" >&2; exit 1; fi
  BUILD=$(realpath -m "${DUET_BUILD_DIR:-build}")
  scripts/deps.sh
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD" --target duet-bridge duetctl spank_duet
  CTL=$BUILD/duetctl/duetctl
}

# Stops what the demo started, by pid, then the Slurm cluster.
# shellcheck disable=SC2317  # called by the EXIT trap
demo_cleanup() {
  local p
  for p in "$SCHED" "$BRIDGE" "$FAKE"; do
    if [[ -n $p ]]; then kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; fi
  done
  "$HARNESS" stop "$ROOT" || true
  echo "logs: $STATE/, $ROOT/log/"
}

# A real local Slurm cluster (tests/integration/slurm_cluster.sh: munged,
# slurmctld; slurmds come later, once duet-bridge created their nodes) with
# spank_duet.so in its plugstack talking to duet-bridge on a unix socket.
start_slurm() {
  HARNESS=$PWD/tests/integration/slurm_cluster.sh
  STATE=$(mktemp -d /tmp/duet-demo.XXXXXX)
  export DUET_SERVER=unix://$STATE/bridge.sock
  ROOT=$("$HARNESS" init --lifetime 600 --spank "$BUILD/slurm_plugin/spank_duet.so:bridge=$DUET_SERVER timeout_ms=2000 munge_socket=@ROOT@/munge/munge.socket.2")
  trap demo_cleanup EXIT
  "$HARNESS" start "$ROOT"
  export SLURM_CONF=$ROOT/etc/slurm.conf
}

# The fake kube-apiserver (tests/fakes/fake_apiserver.py, the real wire
# protocol; "$@": its options) and a kubeconfig for it; API_URL is its URL.
start_apiserver() {
  tests/fakes/fake_apiserver.py --port-file "$STATE/apiserver.port" "$@" >"$STATE/apiserver.log" 2>&1 &
  FAKE=$!
  for _ in $(seq 100); do [[ -s $STATE/apiserver.port ]] && break; sleep 0.1; done
  API_URL=http://127.0.0.1:$(cat "$STATE/apiserver.port")
  cat >"$STATE/kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "$API_URL"}}]
users: [{name: demo, user: {token: demo}}]
contexts: [{name: fake, context: {cluster: fake, user: demo, namespace: default}}]
current-context: fake
YAML
}
kube() { kubectl --kubeconfig "$STATE/kubeconfig" --cache-dir "$STATE/kubectl-cache" "$@"; }

# duet-bridge on $STATE/bridge.yaml, its log in $STATE/bridge.log; returns
# once its gRPC socket is up.
start_bridge() {
  "$BUILD/bridge/server/duet-bridge" --config "$STATE/bridge.yaml" >"$STATE/bridge.log" 2>&1 &
  BRIDGE=$!
  for _ in $(seq 100); do [[ -S $STATE/bridge.sock ]] && break; sleep 0.1; done
  [[ -S $STATE/bridge.sock ]] || { cat "$STATE/bridge.log"; exit 1; }
}

# Polls CMD every 0.1 s until it succeeds; after SECONDS, says what it
# waited for and exits (the trap stops everything).
wait_for() {
  local seconds=$1 what=$2
  shift 2
  local end=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      echo "scripts/demo.sh: gave up after ${seconds}s waiting for $what (logs in $STATE)" >&2
      exit 1
    fi
    sleep 0.1
  done
}

idle_nodes() { [[ $(sinfo -h -N -t idle -o %N | wc -l) -eq $1 ]]; }

# sbatch -w NODE --gres=gpu:2 (sleep 300) and wait until it runs and
# duet-bridge's sync imported it; JOB is its id.
slurm_job() {
  JOB=$(sbatch --parsable -o /dev/null -w "$1" --gres=gpu:2 --wrap 'sleep 300')
  echo; echo "== sbatch -w $1 --gres=gpu:2 --wrap 'sleep 300': job $JOB"
  # shellcheck disable=SC2317  # called by wait_for
  job_imported() { [[ $(squeue -h -j "$JOB" -o %T) == RUNNING ]] && "$CTL" holds | grep -q "job $JOB "; }
  wait_for 20 "job $JOB to run and be in duet-bridge's ledger" job_imported
}

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
  demo_build --slurm
  start_slurm

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
  # The fake kube-apiserver that the extender binds pods in and the pod watch
  # follows.
  start_apiserver

  cat >"$STATE/bridge.yaml" <<YAML
grpc: {listen: "", unix_socket: $STATE/bridge.sock}
metrics: {listen: ""}
journal: {dir: $STATE/journal}
inventory: {source: file, file: $STATE/nodes.yaml}
slurm: {enabled: true, conf_path: $SLURM_CONF, sync_period: 1s, munge_socket: $ROOT/munge/munge.socket.2}
kubernetes: {kubeconfig: $STATE/kubeconfig}
extender: {listen: "127.0.0.1:0", url_prefix: /duet}
YAML
  start_bridge

  # duet-bridge created the Slurm nodes (State=FUTURE); start their slurmds.
  local gpu='Name=gpu Type=nvidia-h100-80gb File='$ROOT'/dev/nvidia[0-7]'
  local tpu='Name=tpu Type=tpu-v5-lite-podslice File='$ROOT'/dev/accel[0-3]'
  "$HARNESS" slurmd "$ROOT" gke-h100-a 51 "CPUs=8 RealMemory=16000 Gres=gpu:nvidia-h100-80gb:8" "$gpu"
  "$HARNESS" slurmd "$ROOT" gke-h100-b 52 "CPUs=8 RealMemory=16000 Gres=gpu:nvidia-h100-80gb:8" "$gpu"
  "$HARNESS" slurmd "$ROOT" gke-tpu-a 53 "CPUs=8 RealMemory=16000 Gres=tpu:tpu-v5-lite-podslice:4" "$tpu"
  wait_for 30 "3 idle Slurm nodes" idle_nodes 3
  echo "== duet-bridge log"; cat "$STATE/bridge.log"
  echo; echo "== sinfo (nodes created by duet-bridge)"; sinfo -N -o '%N %t %G %f'

  slurm_job gke-h100-a
  squeue -o '%i %T %N %b'
  echo; echo "== duetctl nodes"; "$CTL" nodes
  echo; echo "== duetctl holds"; "$CTL" holds

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
  echo; echo "== duetctl nodes (a Slurm job and a pod on $node's GPUs)"; "$CTL" nodes
  echo; echo "== duetctl holds"; "$CTL" holds
}

# --dra: the DRA lending mode (docs/dra.md) on the same kind of world as
# --slurm: a real local Slurm cluster with one 8-GPU node in a lending pool,
# duet-bridge with slurm.enabled and dra.enabled (its admission webhook on
# HTTPS, its DeviceTaintRules, its lend jobs), the fake kube-apiserver at
# Kubernetes 1.37 calling that webhook on resourceclaims/status, the
# ResourceSlices NVIDIA's DRA driver would publish
# (tests/fakes/fake_dra_driver.py) and, standing in for kube-scheduler's
# DynamicResources plugin, tests/fakes/test_scheduler.py, which places pods
# that name no schedulerName. A Slurm job takes 2 GPUs; a pod asks
# `nvidia.com/gpu: 2` (the DRA extended resource) as for the default
# scheduler; every device not lent is tainted, so the pod is unschedulable
# until duet lends it 2 devices (Slurm lend jobs), which the scheduler then
# allocates through duet's webhook: the ledger shows the job and the claim on
# disjoint GPUs. Then the pod and its claim go: the devices go back to lent,
# are reclaimed (lend jobs cancelled, rules back). Stops everything it
# started. Needs root, as --slurm.
dra_demo() {
  demo_build --dra
  start_slurm
  local node=gke-h100-1 pool=lend-h100 taint=duet.dev/not-lent

  # The fake kube-apiserver at 1.37: DeviceTaintRules at resource.k8s.io/v1.
  start_apiserver --kube-version 1.37
  # The inventory names each GPU by the uuid the driver publishes for it
  # (duet checks the slices against the inventory before lending).
  local uuids
  uuids=$(python3 -c 'import sys; sys.path.insert(0, "tests/fakes"); import fake_dra_driver as d
print(", ".join(x["attributes"]["uuid"]["string"] for x in d.nvidia_devices(sys.argv[1], 8)))' "$node")
  cat >"$STATE/nodes.yaml" <<YAML
nodes:
  - {name: $node, cpus: 16, memory_mib: 16000, pool: $pool, zone: us-central1-a,
     labels: {duet.dev/slurm-node-addr: 127.0.0.61, cloud.google.com/gke-accelerator: nvidia-h100-80gb,
              cloud.google.com/gke-nodepool: $pool},
     gpus: {count: 8, model: nvidia-h100-80gb, ids: [$uuids]}}
YAML
  # The webhook's serving certificate, signed by a CA of its own; the
  # ValidatingWebhookConfiguration carries the CA as its caBundle.
  mkdir "$STATE/tls"
  (cd "$STATE/tls" &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=duet-demo-ca &&
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 &&
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >ext.cnf &&
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
      -days 1 -extfile ext.cnf) >"$STATE/tls/openssl.log" 2>&1

  # What the cluster has before duet: the DeviceClass that serves
  # nvidia.com/gpu from DRA (KEP-5004) and the driver's ResourceSlices.
  echo "== kubectl create -f deviceclass.yaml; fake_dra_driver.py publish (the cluster before duet)"
  cat >"$STATE/deviceclass.yaml" <<'YAML'
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.nvidia.com"'}}]
  extendedResourceName: nvidia.com/gpu
YAML
  kube create -f "$STATE/deviceclass.yaml"
  python3 tests/fakes/fake_dra_driver.py publish --server "$API_URL" --shape nvidia --nodes 1 --devices 8 \
    --node-prefix "${node%1}"

  cat >"$STATE/bridge.yaml" <<YAML
grpc: {listen: "", unix_socket: $STATE/bridge.sock}
metrics: {listen: ""}
journal: {dir: $STATE/journal}
inventory: {source: file, file: $STATE/nodes.yaml}
slurm: {enabled: true, conf_path: $SLURM_CONF, sync_period: 1s, munge_socket: $ROOT/munge/munge.socket.2}
kubernetes: {kubeconfig: $STATE/kubeconfig, watch_pods: true}
dra:
  enabled: true
  pools: [$pool]
  drivers: [gpu.nvidia.com]
  taint_key: $taint
  reclaim_after: 5s
  webhook:
    listen: "127.0.0.1:0"
    admission_grace: 2s
    tls: {cert_file: $STATE/tls/server.crt, key_file: $STATE/tls/server.key}
YAML
  start_bridge
  # shellcheck disable=SC2317  # called by wait_for
  webhook_port() { sed -n 's/.*dra: lending pools.*webhook on port \([0-9]*\).*/\1/p' "$STATE/bridge.log" | grep .; }
  wait_for 20 "duet-bridge's DRA mode (its webhook)" webhook_port
  local hook_url
  hook_url=https://127.0.0.1:$(webhook_port | head -1)/validate-resourceclaim-status
  cat >"$STATE/webhook.yaml" <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: duet-dra}
webhooks:
- name: resourceclaims.dra.duet.dev
  admissionReviewVersions: [v1]
  sideEffects: NoneOnDryRun
  failurePolicy: Fail
  timeoutSeconds: 10
  clientConfig: {url: "$hook_url", caBundle: $(base64 -w0 "$STATE/tls/ca.crt")}
  rules: [{apiGroups: [resource.k8s.io], apiVersions: ["*"], operations: [UPDATE],
           resources: [resourceclaims/status]}]
YAML
  echo; echo "== kubectl create -f webhook.yaml (duet's admission webhook: $hook_url)"
  kube create -f "$STATE/webhook.yaml"

  # duet-bridge created the Slurm node; start its slurmd.
  "$HARNESS" slurmd "$ROOT" "$node" 61 "CPUs=16 RealMemory=16000 Gres=gpu:nvidia-h100-80gb:8" \
    "Name=gpu Type=nvidia-h100-80gb File=$ROOT/dev/nvidia[0-7]"
  wait_for 30 "$node idle in Slurm" idle_nodes 1
  # shellcheck disable=SC2317  # called by wait_for
  rules() { [[ $(kube get devicetaintrules -o name | wc -l) -eq $1 ]]; }
  wait_for 30 "a DeviceTaintRule on each of the 8 GPUs" rules 8
  # The stand-in for kube-scheduler (default-scheduler: pods naming no schedulerName).
  python3 tests/fakes/test_scheduler.py --server "$API_URL" --interval 0.2 >"$STATE/scheduler.log" 2>&1 &
  SCHED=$!

  echo; echo "== duet-bridge log"; cat "$STATE/bridge.log"
  echo; echo "== sinfo (the node created by duet-bridge)"; sinfo -N -o '%N %t %G %f'
  local cols=NAME:.metadata.name,DRIVER:.spec.deviceSelector.driver,DEVICE:.spec.deviceSelector.device
  cols+=,TAINT:.spec.taint.key,EFFECT:.spec.taint.effect
  echo; echo "== kubectl get devicetaintrules (nothing lent: every GPU is tainted)"
  kube get devicetaintrules -o custom-columns="$cols"

  slurm_job "$node"
  squeue -o '%i %j %T %N %b'
  echo; echo "== duetctl nodes"; "$CTL" nodes
  echo; echo "== duetctl holds"; "$CTL" holds

  # A pod as written for the default scheduler: no schedulerName, 2 GPUs as
  # the extended resource.
  cat >"$STATE/pod.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: train-0, namespace: default, labels: {app: train}}
spec:
  containers:
  - name: trainer
    image: nvcr.io/nvidia/pytorch:24.10-py3
    resources:
      limits: {nvidia.com/gpu: "2", cpu: "2", memory: 4Gi}
YAML
  echo; echo "== kubectl apply -f pod.yaml (no schedulerName: the default scheduler places it)"
  kube apply -f "$STATE/pod.yaml"
  # shellcheck disable=SC2317  # called by wait_for
  bound() { [[ -n $(kube get pod train-0 -o jsonpath='{.spec.nodeName}') ]]; }
  wait_for 60 "the test scheduler to bind train-0" bound
  local claim
  claim=$(kube get pod train-0 -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')
  echo; echo "== test scheduler log (kube-scheduler's part: no untainted GPU, duet lends 2, allocate, bind)"
  cat "$STATE/scheduler.log"
  echo; echo "== duet-bridge log (the lending)"; grep -E 'dra: (lent|pod)' "$STATE/bridge.log" || true
  echo; echo "== kubectl get pod train-0"
  kube get pod train-0 -o custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,CLAIM:.status.extendedResourceClaimStatus.resourceClaimName
  echo; echo "== kubectl get resourceclaim $claim (the devices the scheduler allocated; duet's webhook admitted them)"
  kube get resourceclaim "$claim" \
    -o custom-columns=NAME:.metadata.name,NODE:.status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0],DEVICES:.status.allocation.devices.results[*].device
  # shellcheck disable=SC2317  # called by wait_for
  claim_held() { "$CTL" holds | grep -q claim; }
  wait_for 20 "the claim in duet-bridge's ledger" claim_held
  echo; echo "== duetctl holds (job $JOB and the claim on disjoint GPUs of $node)"; "$CTL" holds
  echo; echo "== duetctl nodes"; "$CTL" nodes
  echo; echo "== squeue (one lend job per lent GPU)"; squeue -o '%i %j %T %N %b'
  echo; echo "== kubectl get devicetaintrules (the 6 GPUs not lent keep theirs)"
  kube get devicetaintrules -o custom-columns="$cols"

  # The pod ends; the resourceclaim controller deallocates its claim and
  # deletes it.
  echo; echo "== kubectl delete pod train-0; the claim deallocated and deleted (the resourceclaim controller's part)"
  kube delete pod train-0 --grace-period=0 --force 2>&1 | grep -v '^Warning'
  kube patch resourceclaim "$claim" --subresource=status --type=merge -p '{"status": null}'
  kube delete resourceclaim "$claim"
  # shellcheck disable=SC2317  # called by wait_for
  claim_gone() { ! "$CTL" holds | grep -q claim; }
  wait_for 20 "the claim's GPUs back to lent" claim_gone
  echo; echo "== duetctl holds (the GPUs lent and free again)"; "$CTL" holds
  # shellcheck disable=SC2317  # called by wait_for
  reclaimed() { rules 8 && ! squeue -h -o %j | grep -q duet-lend; }
  wait_for 60 "duet to reclaim the lent GPUs" reclaimed
  echo; echo "== squeue (reclaimed after dra.reclaim_after, 5s: the lend jobs cancelled)"
  squeue -o '%i %j %T %N %b'
  echo; echo "== duetctl holds (the GPUs Slurm's again)"; "$CTL" holds
  echo; echo "== kubectl get devicetaintrules (every GPU not lent, tainted again)"
  kube get devicetaintrules -o custom-columns="$cols"
}

if [[ "${1:-}" == "--slurm" ]]; then slurm_demo; exit 0; fi
if [[ "${1:-}" == "--dra" ]]; then dra_demo; exit 0; fi
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
