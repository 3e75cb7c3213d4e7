#!/bin/bash
# bench/slurm/run_bench.sh [--quick] [--spank-only] SLURM_BENCH_TOOL SPANK_DUET_SO [DUET_NODE]
#
# Slurm-side figures, each against its CLI baseline in the same run on the
# same private cluster (tests/integration/slurm_cluster.sh):
#  1. placeholder grant latency: LibSlurmClient allocate + IDX read-back vs
#     `salloc --immediate --no-shell` (each cancelled before the next);
#  2. node sync: N inventory nodes -> SlurmSync.RunOnce -> all visible, vs a
#     loop of `scontrol create`;
#  3. SPANK overhead: `srun -n1 true` without the plugin, with it (no devices:
#     no bridge call), and `srun -n1 --gres=gpu:1 true` with it (Hold+Release
#     over gRPC with the cluster's credential, munge or slurm.key, to a
#     ledger service) vs the same
#     without the plugin; variants alternate within each round.
#     DUET_BENCH_OLD_SPANK=path/to/spank_duet.so adds a previous build as a
#     third variant (before/after in the same run). With DUET_NODE (the
#     duet-node binary), the agent path runs as one more variant: duet-node
#     --step-agent-socket forwarding to the same ledger service, plugstack
#     agent= with the cluster's credential (no gRPC in slurmstepd); and
#     its floor ("floor"): the same plugin line against `slurm_bench_tool
#     answer`, an agent that answers at once without a bridge.
#     DUET_BENCH_OLD_NODE=path/to/old/duet-node adds it as one more agent
#     variant (its own socket, the same spank_duet.so and ledger service),
#     for before/after of the agent in the same rounds ("agent_old").
#     Each variant's added time is also given per round: the median of its
#     per-round differences against no plugin, with a 95% interval; the
#     variants rotate their place in the round. DUET_BENCH_VARIANTS="agent
#     empty" runs only those (and none); each timed srun starts
#     DUET_BENCH_GAP_MS (100) after the last step left Slurm.
#     DUET_BENCH_CPUS="SLURM DUET" (taskset lists, e.g. "0 1"): Slurm (munged,
#     slurmctld, slurmd, its slurmstepds, srun) on the CPUs SLURM, the ledger
#     service, duet-node and the floor's agent on DUET, so that their work
#     does not compete with the step's set-up for a CPU (a GPU node's many
#     cores, the bridge on another machine). Unset: all share every CPU.
#     DUET_BENCH_OUT=DIR keeps each variant's srun times (ms, one line per
#     round, srun_VARIANT and srun_VARIANT_gpu) in DIR.
# Prints a markdown table. --quick: small counts (the ctest smoke run).
set -euo pipefail
quick=0 spank_only=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --quick) quick=1 ;;
    --spank-only) spank_only=1 ;;  # only part 3
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done
TOOL=$(readlink -f "$1"); SO=$(readlink -f "$2"); NODE_BIN=${3:+$(readlink -f "$3")}
HERE=$(cd "$(dirname "$0")" && pwd)
CL=$HERE/../../tests/integration/slurm_cluster.sh
if ((quick)); then NPH=10; NNODES=20; NSRUN=5; else NPH=200; NNODES=200; NSRUN=50; fi
NSRUN=${DUET_BENCH_ROUNDS:-$NSRUN}  # rounds of part 3

# DUET_BENCH_CPUS: this shell and all it starts from here on (the cluster,
# every srun) on SLURM's CPUs; on_duet_cpus runs duet's own processes on
# DUET's (taskset execs, so $! is the process itself).
SLURM_CPUS= DUET_CPUS=
if [[ -n ${DUET_BENCH_CPUS:-} ]]; then
  read -r SLURM_CPUS DUET_CPUS <<<"$DUET_BENCH_CPUS"
  [[ -n $SLURM_CPUS && -n $DUET_CPUS ]] || {
    echo "DUET_BENCH_CPUS: want \"SLURM_CPUS DUET_CPUS\", got \"$DUET_BENCH_CPUS\"" >&2; exit 2; }
  taskset -c "$DUET_CPUS" true || { echo "DUET_BENCH_CPUS: bad CPU list \"$DUET_CPUS\"" >&2; exit 2; }
  taskset -pc "$SLURM_CPUS" $$ >/dev/null ||
    { echo "DUET_BENCH_CPUS: bad CPU list \"$SLURM_CPUS\"" >&2; exit 2; }
fi
on_duet_cpus() {
  if [[ -n $DUET_CPUS ]]; then exec taskset -c "$DUET_CPUS" "$@"; else exec "$@"; fi
}

ROOT=$("$CL" init --max-nodes $((2 * NNODES + 16)) --lifetime 900)
export SLURM_CONF=$ROOT/etc/slurm.conf
SOCK=$ROOT/run/bridge.sock
SERVE_PID= NODE_PID= OLD_NODE_PID= FLOOR_PID=
cleanup() {
  [[ -n $NODE_PID ]] && kill "$NODE_PID" 2>/dev/null || true
  [[ -n $OLD_NODE_PID ]] && kill "$OLD_NODE_PID" 2>/dev/null || true
  [[ -n $SERVE_PID ]] && kill "$SERVE_PID" 2>/dev/null || true
  [[ -n $FLOOR_PID ]] && kill "$FLOOR_PID" 2>/dev/null || true
  "$CL" stop "$ROOT" || true
}
trap cleanup EXIT
# slurmstepd logs where the plugin's time goes (spank_duet.c, debug level).
sed -i 's/^SlurmdDebug=info$/SlurmdDebug=debug/' "$SLURM_CONF"
"$CL" start "$ROOT"
"$CL" create "$ROOT" bn 40 "CPUs=8 RealMemory=16000 Gres=gpu:h100:8 Feature=bench" >/dev/null
"$CL" slurmd "$ROOT" bn 40 "CPUs=8 RealMemory=16000 Gres=gpu:h100:8" \
  "Name=gpu Type=h100 File=$ROOT/dev/nvidia[0-7]"
for ((i = 0; i < 200; i++)); do
  scontrol show node bn 2>/dev/null | grep -qE 'State=IDLE(\+DYNAMIC_NORM)? ' && break; sleep 0.05
done
((i < 200)) || { echo "node bn did not come up" >&2; exit 1; }

now_ns() { date +%s%N; }
pct() {  # pct FILE -> "p50 p99 n"
  sort -n "$1" | awk '{a[NR]=$1} END {i50=int(0.50*(NR-1))+1; i99=int(0.99*(NR-1))+1;
    printf "%.2f %.2f %d\n", a[i50], a[i99], NR}'
}
ms_since() { echo "scale=3; ($(now_ns) - $1) / 1000000" | bc; }
# paired A B -> "median lo hi n": the median of the per-round differences
# A[i] - B[i] (the two files hold one time per round, in round order) and its
# 95% confidence interval from order statistics (distribution-free: the
# differences of ranks n/2 -+ 0.98 sqrt(n), which cover the true median with
# a probability of about 0.95; for n below 10, the smallest and largest).
paired() {
  paste -d' ' "$1" "$2" | awk '{print $1 - $2}' | sort -g |
    awk '{d[NR]=$1} END {n=NR; m=(n%2) ? d[(n+1)/2] : (d[n/2]+d[n/2+1])/2;
      k=int((n - 1.96*sqrt(n))/2); if (k < 1) k=1;
      printf "%.2f %.2f %.2f %d\n", m, d[k], d[n+1-k], n}'
}
out=$ROOT/out; mkdir -p "$out"

if ((!spank_only)); then
# 1. placeholders
"$TOOL" placeholders bn "$NPH" >"$out/ph_client"
for ((i = 0; i < NPH; i++)); do
  t=$(now_ns)
  o=$(salloc --immediate=1 --no-shell -w bn --gres=gpu:1 -J duet-bench 2>&1)
  ms_since "$t" >>"$out/ph_cli"
  id=$(sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p' <<<"$o")
  [[ -n $id ]] || { echo "salloc failed: $o" >&2; exit 1; }
  scancel "$id"
  until [[ -z $(squeue -h -j "$id" -t R,CG -o %i 2>/dev/null) ]]; do sleep 0.005; done
done

# 2. node sync
sync_s=$("$TOOL" nodesync "$NNODES" sync-)
t=$(now_ns)
for ((i = 0; i < NNODES; i++)); do
  scontrol create NodeName=cli-$i NodeAddr=10.9.$((i / 250)).$((i % 250 + 1)) CPUs=8 \
    RealMemory=16000 Gres=gpu:h100:8 Feature=bench State=FUTURE
done
until [[ $(scontrol --future show node -o | grep -c '^NodeName=cli-') -ge $NNODES ]]; do sleep 0.01; done
cli_s=$(echo "scale=3; ($(now_ns) - $t) / 1000000000" | bc)
fi

# 3. SPANK overhead (plugstack.conf is read by every srun and slurmstepd).
# The variants alternate within each round, so load from other processes on
# the machine hits them alike; medians are compared.
(on_duet_cpus "$TOOL" serve "$SOCK" bn) &
SERVE_PID=$!
for ((i = 0; i < 100; i++)); do [[ -S $SOCK ]] && break; sleep 0.05; done
# The credential the cluster's auth calls for (slurm_cluster.sh: auth/slurm
# on Slurm 23.11+, munge before).
# The other credential runs as a third variant (the ledger service here
# checks neither; munged and slurm.key exist either way), so the two are
# compared in the same rounds.
KEY_ARGS="bridge=unix://$SOCK tpu=no auth=slurm_key slurm_key=$ROOT/etc/slurm.key"
MUNGE_ARGS="bridge=unix://$SOCK tpu=no munge_socket=$ROOT/munge/munge.socket.2"
if grep -qx AuthType=auth/slurm "$SLURM_CONF"; then
  CRED=slurm_key; ARGS=$KEY_ARGS; OTHER=munge; OTHER_ARGS=$MUNGE_ARGS
else
  CRED=munge; ARGS=$MUNGE_ARGS; OTHER=slurm_key; OTHER_ARGS=$KEY_ARGS
fi
SLURM_VER=$(srun --version | awk '{print $2}')
variants=(none plugin other)
declare -A line=([none]="" [plugin]="required $SO $ARGS" [other]="required $SO $OTHER_ARGS")
if [[ -n $NODE_BIN ]]; then  # the agent path: duet-node's step agent on the same ledger
  AGENT=$ROOT/run/duet-agent.sock
  (on_duet_cpus "$NODE_BIN" --bridge "unix:$SOCK" --node-name bn --no-kubernetes \
    --plugin-dir "$ROOT/run/dp" --pod-resources-socket "" --step-agent-socket "$AGENT" \
    --log-level warn >"$ROOT/log/duet-node.log" 2>&1) &
  NODE_PID=$!
  for ((i = 0; i < 100; i++)); do [[ -S $AGENT ]] && break; sleep 0.05; done
  [[ -S $AGENT ]] || { echo "duet-node did not serve $AGENT" >&2; exit 1; }
  variants+=(agent)
  line[agent]="required $SO agent=unix://$AGENT ${ARGS}"
  if [[ -n ${DUET_BENCH_OLD_NODE:-} ]]; then  # a previous duet-node, for before/after
    OLD_AGENT=$ROOT/run/duet-agent-old.sock
    (on_duet_cpus "$(readlink -f "$DUET_BENCH_OLD_NODE")" --bridge "unix:$SOCK" --node-name bn \
      --no-kubernetes --plugin-dir "$ROOT/run/dp-old" --pod-resources-socket "" \
      --step-agent-socket "$OLD_AGENT" --log-level warn >"$ROOT/log/duet-node-old.log" 2>&1) &
    OLD_NODE_PID=$!
    for ((i = 0; i < 100; i++)); do [[ -S $OLD_AGENT ]] && break; sleep 0.05; done
    [[ -S $OLD_AGENT ]] || { echo "the old duet-node did not serve $OLD_AGENT" >&2; exit 1; }
    variants+=(agent_old)
    line[agent_old]="required $SO agent=unix://$OLD_AGENT ${ARGS}"
  fi
  # The agent path's floor: the same plugin and credential, against an agent
  # that answers every request OK at once without a bridge (slurm_bench_tool
  # answer): what the plugin's own side of the path costs a step.
  FLOOR=$ROOT/run/duet-floor.sock
  (on_duet_cpus "$TOOL" answer "$FLOOR" 2>"$ROOT/log/floor.log") &
  FLOOR_PID=$!
  for ((i = 0; i < 100; i++)); do [[ -S $FLOOR ]] && break; sleep 0.05; done
  [[ -S $FLOOR ]] || { echo "slurm_bench_tool answer did not serve $FLOOR" >&2; exit 1; }
  variants+=(floor)
  line[floor]="required $SO agent=unix://$FLOOR ${ARGS}"
fi
if [[ -n ${DUET_BENCH_EMPTY_SPANK:-} ]]; then  # a plugin that does nothing
  variants+=(empty)
  line[empty]="required $(readlink -f "$DUET_BENCH_EMPTY_SPANK")"
fi
if [[ -n ${DUET_BENCH_OLD_SPANK:-} ]]; then  # a previous build, for before/after
  variants+=(old)
  if [[ -n $NODE_BIN ]]; then
    # On the agent path, through the same duet-node; a second name for its
    # socket tells this plugin's debug lines from the current one's.
    OLD_SPANK_AGENT=$ROOT/run/duet-agent-oldspank.sock
    ln -sf "$AGENT" "$OLD_SPANK_AGENT"
    line[old]="required $(readlink -f "$DUET_BENCH_OLD_SPANK") agent=unix://$OLD_SPANK_AGENT ${ARGS}"
  else
    line[old]="required $(readlink -f "$DUET_BENCH_OLD_SPANK") bridge=unix://$SOCK tpu=no"
  fi
fi
# DUET_BENCH_VARIANTS="none agent empty": only those (none is always run).
if [[ -n ${DUET_BENCH_VARIANTS:-} ]]; then
  keep=(none)
  for v in "${variants[@]}"; do
    [[ $v != none && " $DUET_BENCH_VARIANTS " == *" $v "* ]] && keep+=("$v")
  done
  variants=("${keep[@]}")
fi
# Each timed srun starts once the step before it has left slurmstepd and its
# job has left slurmctld: srun returns before its step's slurm_spank_exit
# (the Release) and the job's completion, and that tail would otherwise be
# timed with the next variant's srun. (Not in the figures before 6 Dec 13:20.)
# Then DUET_BENCH_GAP_MS more (default 100): what the last step left to do
# beside it (duet-node sending its queued Release, a gRPC server's threads
# winding down, munged) is then not timed with the next variant's srun.
# (Not in the figures before 6 Dec 2026 17:00.)
GAP=$(echo "scale=3; ${DUET_BENCH_GAP_MS:-100} / 1000" | bc)
settle() {
  local i
  for ((i = 0; i < 400; i++)); do
    # (A slurmstepd that has exited stays a zombie until reaped: not counted.)
    if [[ -z $(squeue -h -w bn -o %i 2>/dev/null) ]] &&
      ! ps -C slurmstepd -o stat= | grep -qv '^Z'; then
      break
    fi
    sleep 0.01
  done
  sleep "$GAP"
}
one_srun() {  # one_srun FILE ARGS...
  local f=$1; shift
  settle
  t=$(now_ns); srun -w bn "$@" true; ms_since "$t" >>"$f"
}
# CPU time (user + system, all threads) a process has used, in ms.
TCK=$(getconf CLK_TCK)
cpu_ms() { awk -v t="$TCK" '{printf "%d\n", ($14 + $15) * 1000 / t}' "/proc/$1/stat"; }
serve_cpu0=$(cpu_ms "$SERVE_PID"); node_cpu0=${NODE_PID:+$(cpu_ms "$NODE_PID")}
# Each round starts one variant later than the last, so no variant always
# runs first (after the settle) or right after the slowest one.
for ((r = -1; r < NSRUN; r++)); do  # round -1: warm-up, not recorded
  for ((k = 0; k < ${#variants[@]}; k++)); do
    v=${variants[(k + (r < 0 ? 0 : r)) % ${#variants[@]}]}
    echo "${line[$v]}" >"$ROOT/etc/plugstack.conf"
    if ((r < 0)); then srun -w bn true; srun -w bn --gres=gpu:1 true; continue; fi
    one_srun "$out/srun_$v" -n1
    one_srun "$out/srun_${v}_gpu" -n1 --gres=gpu:1
  done
done

if [[ -n ${DUET_BENCH_OUT:-} ]]; then
  mkdir -p "$DUET_BENCH_OUT" && cp "$out"/srun_* "$DUET_BENCH_OUT"/
fi
serve_cpu=$(($(cpu_ms "$SERVE_PID") - serve_cpu0))
node_cpu=${NODE_PID:+$(($(cpu_ms "$NODE_PID") - node_cpu0))}

echo "| measurement | duet | baseline (same run) |"
echo "|---|---|---|"
if [[ -n $DUET_CPUS ]]; then
  echo "| CPUs (DUET_BENCH_CPUS) | ledger service, duet-node, the floor's agent on $DUET_CPUS | munged, slurmctld, slurmd, slurmstepd, srun on $SLURM_CPUS |"
fi
if ((!spank_only)); then
read -r a b n < <(pct "$out/ph_client"); read -r c d m < <(pct "$out/ph_cli")
echo "| placeholder grant, p50 / p99 ms (n=$n) | LibSlurmClient: $a / $b | salloc --immediate --no-shell: $c / $d |"
echo "| $NNODES nodes created and visible, s | SlurmSync.RunOnce: $sync_s | scontrol create loop: $cli_s |"
fi
# against_none VARIANT LABEL [WHAT]: its srun -n1 and --gres=gpu:1 rows
# against no plugin (p50 and p99 of each, over the same rounds).
against_none() {
  local v=$1 label=$2 what=${3:-} a b n c d m
  read -r a b n < <(pct "$out/srun_$v"); read -r c d m < <(pct "$out/srun_none")
  echo "| srun -n1 true, p50 / p99 ms (n=$n) | $label: $a / $b (+$(echo "$a - $c" | bc) at p50) | without: $c / $d |"
  read -r a b n < <(pct "$out/srun_${v}_gpu"); read -r c d m < <(pct "$out/srun_none_gpu")
  echo "| srun -n1 --gres=gpu:1 true$what, p50 / p99 ms (n=$n) | $label: $a / $b (+$(echo "$a - $c" | bc) at p50, +$(echo "$b - $d" | bc) at p99) | without: $c / $d |"
}
read -r c d m < <(pct "$out/srun_none_gpu")
if [[ -s $out/srun_plugin ]]; then
  against_none plugin "with spank_duet" " (Hold+Release over gRPC, $CRED credential, Slurm $SLURM_VER)"
fi
if [[ -s $out/srun_other_gpu ]]; then
  read -r a b n < <(pct "$out/srun_other_gpu")
  echo "| the same with the $OTHER credential (same rounds), p50 / p99 ms (n=$n) | with spank_duet: $a / $b (+$(echo "$a - $c" | bc) at p50) | without: $c / $d |"
fi
# agent_steps SOCKET NAME LABEL: the Hold and Release in slurmstepd of the
# GPU steps whose plugstack named agent=unix://SOCKET (the plugin's debug
# lines name it).
# A plugin that sends the Hold in init_post_opt (agent_path.h) logs that
# send (credential + socket) and, in user_init, the wait for the answer: the
# Hold's cost on the step's path is the two added, step by step (the lines
# come in the steps' order; the steps run one at a time). An older plugin
# asks in user_init only. early_hold SOCKET NAME writes $out/NAME_hold (per
# step, on the step's path) and, when the plugin sent early, NAME_send and
# NAME_rtt (sent to answered: how much of the round trip Slurm's own step
# set-up covered).
early_hold() {
  local sock=$1 name=$2 log=$ROOT/log/slurmd-bn.log
  sed -n "s|.*duet: user_init (auth $CRED): step agent \([0-9.]*\) ms (unix://$sock).*|\1|p" \
    "$log" >"$out/${name}_user_init"
  sed -n "s|.*duet: agent Hold (auth $CRED) sent in init_post_opt: credential \([0-9.]*\) ms, send \([0-9.]*\) ms (unix://$sock).*|\1 \2|p" \
    "$log" >"$out/${name}_esplit"
  awk '{print $1 + $2}' "$out/${name}_esplit" >"$out/${name}_send"
  cut -d' ' -f1 "$out/${name}_esplit" >"$out/${name}_scred"
  cut -d' ' -f2 "$out/${name}_esplit" >"$out/${name}_ssock"
  sed -n "s|.*duet: agent Hold (auth $CRED) answered \([0-9.]*\) ms after init_post_opt sent it.*(unix://$sock).*|\1|p" \
    "$log" >"$out/${name}_rtt"
  if [[ -s $out/${name}_send && $(wc -l <"$out/${name}_send") == $(wc -l <"$out/${name}_user_init") ]]; then
    paste -d' ' "$out/${name}_send" "$out/${name}_user_init" | awk '{print $1 + $2}' >"$out/${name}_hold"
  else
    rm -f "$out/${name}_send" "$out/${name}_rtt"
    cp "$out/${name}_user_init" "$out/${name}_hold"
  fi
}
# The early send's share, as a table cell ("" when the plugin asked in user_init).
early_cell() {
  local name=$1 a b n c d m e f g h
  [[ -s $out/${name}_send && -s $out/${name}_rtt ]] || return 0
  read -r a b n < <(pct "$out/${name}_send"); read -r c d m < <(pct "$out/${name}_rtt")
  read -r e f m < <(pct "$out/${name}_scred"); read -r g h m < <(pct "$out/${name}_ssock")
  echo "; of it sent in init_post_opt $a / $b (credential $e / $f, connect and send $g / $h), answered $c / $d after sending (Slurm's step set-up ran meanwhile)"
}
agent_steps() {
  local sock=$1 name=$2 label=$3 a b n e f k
  early_hold "$sock" "$name"
  sed -n "s|.*duet: exit (auth $CRED): step agent \([0-9.]*\) ms (unix://$sock).*|\1|p" \
    "$ROOT/log/slurmd-bn.log" >"$out/${name}_release"
  [[ -s $out/${name}_hold && -s $out/${name}_release ]] || return 0
  read -r a b n < <(pct "$out/${name}_hold"); read -r e f k < <(pct "$out/${name}_release")
  echo "| in slurmstepd ($CRED, $label), p50 / p99 ms (n=$n) | Hold on the step's path: $a / $b$(early_cell "$name"); Release at exit: $e / $f | — |"
}
if [[ -n $NODE_BIN && -s $out/srun_agent_gpu ]]; then
  read -r a b n < <(pct "$out/srun_agent_gpu")
  echo "| the same through duet-node's step agent (plugstack agent=, $CRED credential, same rounds), p50 / p99 ms (n=$n) | with spank_duet: $a / $b (+$(echo "$a - $c" | bc) at p50, +$(echo "$b - $d" | bc) at p99) | without: $c / $d |"
  read -r a b n < <(pct "$out/srun_agent"); read -r c d m < <(pct "$out/srun_none")
  echo "| srun -n1 true with plugstack agent=, p50 / p99 ms (n=$n) | with spank_duet: $a / $b (+$(echo "$a - $c" | bc) at p50) | without: $c / $d |"
  # The plugin's lines name the agent socket: this duet-node's only.
  early_hold "$AGENT" agent
  # The smoke run (ctest, every CI Slurm) checks that this Slurm gives the
  # plugin the step's GPUs by init_post_opt, where the Hold is sent: else
  # every Hold would be asked in user_init again, correct but slower.
  if ((quick)) && [[ ! -s $out/agent_send ]]; then
    echo "run_bench: no GPU step sent its Hold in init_post_opt on Slurm $SLURM_VER" \
      "(slurmd-bn.log has no \"sent in init_post_opt\" line for $AGENT)" >&2
    exit 1
  fi
  sed -n "s|.*duet: exit (auth $CRED): step agent \([0-9.]*\) ms (unix://$AGENT).*|\1|p" \
    "$ROOT/log/slurmd-bn.log" >"$out/agent_release"
  sed -n "s|.*duet: agent Hold (auth $CRED): credential \([0-9.]*\) ms, agent and bridge \([0-9.]*\) ms (unix://$AGENT).*|\1 \2|p" \
    "$ROOT/log/slurmd-bn.log" >"$out/agent_split"
  if [[ -s $out/agent_hold && -s $out/agent_release && -s $out/agent_split ]]; then
    read -r a b n < <(pct "$out/agent_hold"); read -r e f k < <(pct "$out/agent_release")
    cut -d' ' -f1 "$out/agent_split" >"$out/agent_cred"; cut -d' ' -f2 "$out/agent_split" >"$out/agent_rt"
    read -r g h m < <(pct "$out/agent_cred"); read -r x y m < <(pct "$out/agent_rt")
    echo "| in slurmstepd ($CRED, agent path), p50 / p99 ms (n=$n) | no module loaded; Hold: $a / $b (credential $g / $h, agent and bridge $x / $y); Release at exit: $e / $f | — |"
  elif [[ -s $out/agent_hold && -s $out/agent_release ]]; then
    read -r a b n < <(pct "$out/agent_hold"); read -r e f k < <(pct "$out/agent_release")
    echo "| in slurmstepd ($CRED, agent path), p50 / p99 ms (n=$n) | no module loaded; Hold on the step's path: $a / $b$(early_cell agent); Release at exit: $e / $f | — |"
  fi
  sed -n "s|.*duet: agent Release (auth $CRED): credential \([0-9.]*\) ms, agent and bridge \([0-9.]*\) ms (unix://$AGENT).*|\1 \2|p" \
    "$ROOT/log/slurmd-bn.log" >"$out/agent_rsplit"
  if [[ -s $out/agent_rsplit ]]; then
    cut -d' ' -f1 "$out/agent_rsplit" >"$out/agent_rcred"; cut -d' ' -f2 "$out/agent_rsplit" >"$out/agent_rrt"
    read -r g h n < <(pct "$out/agent_rcred"); read -r x y m < <(pct "$out/agent_rrt")
    echo "| in slurmstepd ($CRED, agent path), Release split, p50 / p99 ms (n=$n) | credential $g / $h; agent (queued answer) $x / $y | — |"
  fi
  if [[ -s $out/srun_agent_old_gpu ]]; then
    read -r a b n < <(pct "$out/srun_agent_old_gpu"); read -r c d m < <(pct "$out/srun_none_gpu")
    echo "| the same through the previous duet-node (\$DUET_BENCH_OLD_NODE, same rounds), p50 / p99 ms (n=$n) | with spank_duet: $a / $b (+$(echo "$a - $c" | bc) at p50, +$(echo "$b - $d" | bc) at p99) | without: $c / $d |"
    agent_steps "$OLD_AGENT" agent_old "previous duet-node"
  fi
fi
# Inside slurmstepd, per GPU step and credential (spank_duet.c's debug lines).
for cred in "$CRED" "$OTHER"; do
  sed -n "s/.*duet: user_init (auth $cred): client module \([0-9.]*\) ms, bridge \([0-9.]*\) ms.*/\1 \2/p" \
    "$ROOT/log/slurmd-bn.log" >"$out/steps"
  [[ -s $out/steps ]] || continue
  cut -d' ' -f1 "$out/steps" >"$out/module"; cut -d' ' -f2 "$out/steps" >"$out/hold"
  sed -n "s/.*duet: exit (auth $cred): bridge \([0-9.]*\) ms.*/\1/p" "$ROOT/log/slurmd-bn.log" \
    >"$out/release"
  read -r a b n < <(pct "$out/module"); read -r c d m < <(pct "$out/hold")
  read -r e f k < <(pct "$out/release")
  echo "| in slurmstepd ($cred), p50 / p99 ms (n=$n) | client module dlopen: $a / $b; Hold (credential + gRPC): $c / $d; Release at exit: $e / $f | — |"
done
if [[ -s $out/srun_floor_gpu ]]; then
  agent_steps "$FLOOR" floor "agent path against an agent answering at once (slurm_bench_tool answer)"
fi
if [[ -s $out/srun_empty ]]; then
  against_none empty "a SPANK plugin that does nothing (\$DUET_BENCH_EMPTY_SPANK)"
fi
if [[ -s $out/srun_old ]]; then
  against_none old "previous spank_duet (\$DUET_BENCH_OLD_SPANK)" " (Hold+Release)"
  if [[ -n ${OLD_SPANK_AGENT:-} ]]; then
    agent_steps "$OLD_SPANK_AGENT" old "previous spank_duet on the agent path, same duet-node"
  fi
fi
# What each plugin adds to the whole srun, round by round: the variants of a
# round ran within a second or two of each other, so load that comes and goes
# (this is a shared 2-core VM) hits both sides of each difference alike,
# which a difference of two medians does not see.
for v in "${variants[@]}"; do
  [[ $v == none ]] && continue
  read -r a lo hi n < <(paired "$out/srun_${v}_gpu" "$out/srun_none_gpu")
  read -r b lo2 hi2 m < <(paired "$out/srun_$v" "$out/srun_none")
  echo "| $v, added per round (median of the $n paired differences, 95% CI), ms | srun -n1 --gres=gpu:1 true: $a [$lo, $hi]; srun -n1 true: $b [$lo2, $hi2] | — |"
done
# The CPU the Hold and Release cost beside the step, on a 2-core machine
# taken from Slurm's own step set-up (at the kernel's tick, 1000/CLK_TCK ms,
# over every GPU step of the run, the warm-up round's included; what the two
# processes use while idle over the run is in it too).
calls=0
for v in "${variants[@]}"; do [[ $v == none || $v == empty || $v == floor ]] || calls=$((calls + NSRUN + 1)); done
if ((calls > 0)); then
  cell="ledger service (this bench's, in the bridge's place): $(echo "scale=2; $serve_cpu / $calls" | bc) ms over $calls GPU steps of every plugin variant"
  if [[ -n $NODE_PID && " ${variants[*]} " == *" agent "* ]]; then
    cell+="; duet-node's step agent: $(echo "scale=2; $node_cpu / ($NSRUN + 1)" | bc) ms over the $((NSRUN + 1)) steps of variant agent"
  fi
  echo "| CPU per GPU step outside slurmstepd (user + system, idle use included) | $cell | — |"
fi
