#!/bin/bash
# slurm_cluster.sh - a real, private Slurm 22.05 cluster on loopback for duet's
# integration tests and benchmarks (Debian 12: slurmctld slurmd munge).
#
# Every instance lives under its own root directory and its own TCP ports, so
# several can run side by side. Only processes this script started are ever
# stopped, by the PIDs it saved; a watchdog stops the cluster after
# --lifetime seconds in case the test that owns it died without cleaning up.
#
#   ROOT=$(slurm_cluster.sh init [--spank SO[:ARGS]] [--max-nodes N] [--lifetime S]
#                                [--auth munge|slurm] [--configless] [--isolated]
#                                [--extra-conf LINES] [--topology-conf LINES])
#                                       # --topology-conf: topology.conf beside slurm.conf (with
#                                       # "TopologyPlugin=topology/block" in --extra-conf)
#                                       # --extra-conf: lines appended to slurm.conf (partitions,
#                                       # preemption; "PartitionName=duet ..." replaces the
#                                       # default partition line)
#                                       # --configless: SlurmctldParameters=enable_configless,
#                                       # reconfig_on_restart, as Slinky's slurm.conf (for
#                                       # slurmd-configless)
#                                       # (@ROOT@ in ARGS: the root, e.g. munge_socket=@ROOT@/munge/munge.socket.2)
#                                       # new root (mktemp -d), conf, munge key, devices
#                                       # --auth (default $DUET_SLURM_AUTH, else slurm
#                                       # where Slurm has auth/slurm, 23.11+, else munge):
#                                       # slurm = AuthType=auth/slurm, CredType=cred/slurm,
#                                       # AuthInfo=use_client_ids, $ROOT/etc/slurm.key, as
#                                       # Slinky runs Slurm. munged runs either way.
#                                       # --isolated (or $DUET_SLURM_ISOLATED=1): a cluster
#                                       # laid out as the chart and Slinky deploy it, each
#                                       # daemon in a pod's mount namespace (pod_ns.sh) with
#                                       # only what its pod mounts; implies --configless, and
#                                       # slurm.conf has no PlugStackConfig= (Slurm's default:
#                                       # plugstack.conf beside slurm.conf, which configless
#                                       # slurmds get from slurmctld, as under Slinky). Marked
#                                       # by $ROOT/run/isolated; start, ctld-start and
#                                       # slurmd-configless then run their daemon in its pod
#                                       # (see "Isolated clusters" below)
#   slurm_cluster.sh start ROOT         # munged + slurmctld (-c: fresh state) + watchdog
#   slurm_cluster.sh ctld-stop ROOT     # SIGTERM slurmctld only (state is kept)
#   slurm_cluster.sh ctld-start ROOT    # slurmctld again without -c (recovers state)
#   slurm_cluster.sh ctld-kill ROOT     # SIGKILL slurmctld (state since its last save is lost)
#   slurm_cluster.sh create ROOT NAME IDX "ATTRS"
#                                       # scontrol create NodeName=NAME NodeAddr=127.0.0.IDX ... State=FUTURE
#   slurm_cluster.sh slurmd ROOT NAME IDX "CONF" [GRES.CONF LINES...]
#                                       # gres.conf lines + slurmd -Z -N NAME on 127.0.0.IDX
#                                       # (the node must already exist in slurmctld)
#                                       # slurmd and every task (TaskProlog) preload
#                                       # loopback_bind.so: connections from a node
#                                       # come from its 127.0.0.IDX (srun in sbatch,
#                                       # NodeAddr on Slurm 24.11+)
#   slurm_cluster.sh slurmd-configless ROOT NAME IDX "CONF" [GRES.CONF LINES...]
#                                       # as Slinky's NodeSet pods start slurmd: configless
#                                       # (slurmd -Z --conf-server 127.0.0.1:PORT --conf CONF,
#                                       # no local slurm.conf), registering its own dynamic
#                                       # node NAME (no create first); on 127.0.0.IDX with
#                                       # loopback_bind.so; new gres.conf lines reach it
#                                       # through slurmctld (scontrol reconfigure)
#   slurm_cluster.sh slurmd-stop ROOT NAME
#   slurm_cluster.sh stop ROOT          # cancel jobs, stop what we started, by PID
#   slurm_cluster.sh env ROOT           # prints "export SLURM_CONF=..."
#   slurm_cluster.sh sackd CONF
#                                       # exec sackd -D in the foreground, as duet-bridge's
#                                       # pod runs it beside the bridge: its key from
#                                       # $SLURM_SACK_KEY, else slurm.key beside CONF; its
#                                       # socket at /run/slurm/sack.socket (so: inside a
#                                       # pod's mount namespace, pod_ns.sh)
#   slurm_cluster.sh munged KEY         # exec munged -F with KEY on munge's default socket
#                                       # /run/munge/munge.socket.2 (a pod's munged sidecar;
#                                       # inside pod_ns.sh)
#
# Isolated clusters (init --isolated): every pod is a pod_ns.sh namespace
# with an empty /run, /tmp (and the directory holding ROOT) hidden, as is
# /etc/slurm where the machine has one, and only these bound back (at their
# paths in ROOT unless said otherwise); $ROOT/pods/POD/{log,run} are each
# pod's own log and pid directories, linked from $ROOT/log for readers:
#   slurmctld: $ROOT/etc (its ConfigMap and slurm.key Secret), $ROOT/state,
#              its log and run dirs; auth/munge: the munged socket (a munge
#              sidecar's); auth/slurm: the caller's /run/slurmctld (made if
#              missing), so that its sack.socket is where Slurm's clients
#              outside (the tests, as a login pod) look, as without --isolated
#   slurmd (slurmd-configless): no slurm.conf, nothing of $ROOT/etc but
#              task_prolog.sh; its own $ROOT/spool/NAME, log and run dirs,
#              $ROOT/dev (the node's devices), $ROOT/pods/lib at $ROOT/lib
#              (loopback_bind.so for pods: the image's, with the TaskProlog),
#              an /etc/hosts naming NAME at 127.0.0.IDX, hostname NAME
#              (Slurm 24.11+; 127.0.0.IDX before); auth/slurm: slurm.key at
#              /etc/slurm/slurm.key (where the machine has /etc/slurm, else
#              /run/pod/etc-slurm/slurm.key), named by SLURM_SACK_KEY;
#              auth/munge: the cluster's munged socket at munge's default
#              path and at slurm.conf's AuthInfo path; each directory in
#              $DUET_POD_SHARE (space-separated) at its path, as a shared
#              file system (users' home) the node mounts. In its own UTS
#              namespace; the network stays the host's (loopback_bind.so
#              gives each node its 127.0.0.IDX).
# Slurm's clients run outside every pod, as before.
#
# Ports: $DUET_SLURM_CTLD_PORT / $DUET_SLURM_SLURMD_PORT, else random free ones.
# Devices: $ROOT/dev/nvidia0..7 (c 195 N) and $ROOT/dev/accel0..3 (c 120 N).
set -euo pipefail

die() { echo "slurm_cluster.sh: $*" >&2; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd)

wait_for() {  # wait_for SECONDS CMD...
  local t=$1 i; shift
  for ((i = 0; i < t * 20; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "slurm_cluster.sh: timeout waiting for: $*" >&2; return 1
}

port_free() { ! ss -Hltn "sport = :$1" | grep -q .; }

pick_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    # Below Linux's ephemeral range (32768-60999): a free port there can be
    # taken by any outgoing connection before slurmctld binds it.
    p=$((20000 + RANDOM % 12700))
    if port_free "$p" && port_free "$((p + 1))"; then echo "$p"; return 0; fi
  done
  die "no free port found"
}

set_root() {
  ROOT=${1:?root dir missing}
  [[ -f $ROOT/etc/slurm.conf ]] || die "$ROOT is not a cluster root (no etc/slurm.conf)"
  export SLURM_CONF=$ROOT/etc/slurm.conf
}

# Alive and not a zombie (an orphan may stay a zombie until something reaps it).
alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st:0:1} != Z ]]
}

kill_pidfile() {  # kill_pidfile FILE: SIGTERM, wait up to 5 s, then SIGKILL
  local f=$1 pid i
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if [[ -n $pid ]] && alive "$pid"; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do alive "$pid" || break; sleep 0.05; done
    alive "$pid" && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

cmd_init() {
  local spank="" max_nodes=64 lifetime=900 auth=${DUET_SLURM_AUTH:-} ctld_params="" extra=""
  local topology=""
  local isolated=0
  [[ ${DUET_SLURM_ISOLATED:-} == 1 ]] && isolated=1
  while (($#)); do
    case $1 in
      --spank) spank=$2; shift 2 ;;
      --auth) auth=$2; shift 2 ;;
      --max-nodes) max_nodes=$2; shift 2 ;;
      --lifetime) lifetime=$2; shift 2 ;;
      # As Slinky's generated slurm.conf; 22.05 ignores reconfig_on_restart,
      # which it does not know. Only where asked, so that every other test's
      # cluster stays as it was.
      --configless) ctld_params="SlurmctldParameters=enable_configless,reconfig_on_restart"; shift ;;
      --extra-conf) extra=$2; shift 2 ;;
      --topology-conf) topology=$2; shift 2 ;;
      --isolated) isolated=1; shift ;;
      *) die "init: unknown argument $1" ;;
    esac
  done
  if [[ -z $auth ]]; then
    auth=munge
    compgen -G "/usr/lib/*/slurm-wlm/auth_slurm.so" >/dev/null && auth=slurm
  fi
  [[ $auth == munge || $auth == slurm ]] || die "init: --auth must be munge or slurm, not $auth"
  local ctld_port=${DUET_SLURM_CTLD_PORT:-$(pick_port)}
  local slurmd_port=${DUET_SLURM_SLURMD_PORT:-$((ctld_port + 1))}
  ROOT=$(mktemp -d "${TMPDIR:-/tmp}/duet-slurm.XXXXXX")
  chmod 755 "$ROOT"
  # Isolated: the slurmds are configless, and plugstack.conf reaches them as
  # under Slinky, beside slurm.conf (Slurm's default), not at a path on
  # their file system.
  local plugstack_line="PlugStackConfig=$ROOT/etc/plugstack.conf"
  if ((isolated)); then
    ctld_params="SlurmctldParameters=enable_configless,reconfig_on_restart"
    plugstack_line="# PlugStackConfig: Slurm's default, plugstack.conf beside slurm.conf"
  fi
  local auth_conf
  case $auth in
    munge) auth_conf="AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$ROOT/munge/munge.socket.2" ;;
    slurm) auth_conf="AuthType=auth/slurm
CredType=cred/slurm
AuthInfo=use_client_ids" ;;
  esac
  mkdir -p "$ROOT"/{etc,state,spool,log,run,dev,munge,lib}
  chmod 755 "$ROOT/munge"   # munged needs an o+x socket directory
  mungekey -c -k "$ROOT/munge/munge.key" >/dev/null 2>&1
  chmod 600 "$ROOT/munge/munge.key"
  # auth/slurm reads slurm.key beside slurm.conf; Slurm wants it 0600.
  head -c 1024 /dev/urandom >"$ROOT/etc/slurm.key"
  chmod 600 "$ROOT/etc/slurm.key"
  local i
  # gres/gpu drops GPUs without a character device in File=; never opened.
  for i in 0 1 2 3 4 5 6 7; do mknod "$ROOT/dev/nvidia$i" c 195 "$i"; done
  for i in 0 1 2 3; do mknod "$ROOT/dev/accel$i" c 120 "$i"; done
  echo "$lifetime" >"$ROOT/run/lifetime"
  # Connections from a node's processes leave from the node's own address
  # (loopback_bind.c says why); tasks get it through the TaskProlog.
  ${CC:-cc} -shared -fPIC -O2 -o "$ROOT/lib/loopback_bind.so" "$HERE/loopback_bind.c" -ldl ||
    die "cannot build loopback_bind.so"
  printf '#!/bin/sh\necho "export LD_PRELOAD=%s"\n' "$ROOT/lib/loopback_bind.so" \
    >"$ROOT/etc/task_prolog.sh"
  chmod 755 "$ROOT/etc/task_prolog.sh"

  cat >"$ROOT/etc/slurm.conf" <<EOF
# Generated by duet tests/integration/slurm_cluster.sh
ClusterName=duettest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
$auth_conf
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Many slurmds share SlurmdPort, each bound to its own 127.0.0.N.
CommunicationParameters=NoInAddrAny
DebugFlags=NO_CONF_HASH
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu,tpu
MaxNodeCount=$max_nodes
$ctld_params
TreeWidth=65533
PrivateData=cloud
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
MinJobAge=2
KillWait=2
MessageTimeout=5
$plugstack_line
TaskProlog=$ROOT/etc/task_prolog.sh
EOF
  # The users' partition, unless --extra-conf defines its own "duet".
  if ! grep -q '^PartitionName=duet ' <<<"$extra"; then
    echo "PartitionName=duet Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO DefMemPerCPU=100" \
      >>"$ROOT/etc/slurm.conf"
  fi
  if [[ -n $extra ]]; then printf '%s\n' "$extra" >>"$ROOT/etc/slurm.conf"; fi
  if [[ -n $topology ]]; then printf '%s\n' "$topology" >"$ROOT/etc/topology.conf"; fi
  echo "AutoDetect=off" >"$ROOT/etc/gres.conf"
  : >"$ROOT/etc/plugstack.conf"
  if [[ -n $spank ]]; then
    # SO[:ARG ARG...] -> "required SO ARG ARG..."; @ROOT@ -> the new root
    spank=${spank//@ROOT@/$ROOT}
    echo "required ${spank%%:*} $( [[ $spank == *:* ]] && echo "${spank#*:}")" \
      >"$ROOT/etc/plugstack.conf"
  fi
  if ((isolated)); then
    : >"$ROOT/run/isolated"
    mkdir -p "$ROOT/pods/lib"
    build_pod_loopback_bind
  fi
  echo "$ROOT"
}

# The slurmd pods' loopback_bind.so ($ROOT/pods/lib, bound at $ROOT/lib in
# each pod): loopback_bind.c as it is, but a pod's hostname is its node's
# name (as a NodeSet pod's; two slurmds named 127.0.0.N would both register
# NodeHostName "127"), so the address it binds to is the one the pod's
# /etc/hosts gives that name (kubelet writes it so); a hostname that is an
# address is used as is, as by loopback_bind.c.
build_pod_loopback_bind() {
  cat >"$ROOT/pods/lib/pod_hostaddr.h" <<'EOF'
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
/* loopback_bind.c's gethostname(), compiled with -Dgethostname=pod_hostaddr:
 * the hostname, or the address /etc/hosts names it at. */
static int pod_hostaddr(char* buf, size_t len) {
  struct utsname u;
  struct in_addr a;
  char line[512];
  FILE* f;
  if (uname(&u) != 0) return -1;
  snprintf(buf, len, "%s", u.nodename);
  if (inet_pton(AF_INET, u.nodename, &a) == 1 || (f = fopen("/etc/hosts", "re")) == NULL) {
    return 0;
  }
  while (fgets(line, sizeof(line), f) != NULL) {
    char* save = NULL;
    char* addr = strtok_r(line, " \t\n", &save);
    char* name;
    if (addr == NULL || addr[0] == '#' || inet_pton(AF_INET, addr, &a) != 1) continue;
    while ((name = strtok_r(NULL, " \t\n", &save)) != NULL) {
      if (strcmp(name, u.nodename) == 0) {
        snprintf(buf, len, "%s", addr);
        fclose(f);
        return 0;
      }
    }
  }
  fclose(f);
  return 0;
}
EOF
  ${CC:-cc} -shared -fPIC -O2 -include "$ROOT/pods/lib/pod_hostaddr.h" -Dgethostname=pod_hostaddr \
    -o "$ROOT/pods/lib/loopback_bind.so" "$HERE/loopback_bind.c" -ldl ||
    die "cannot build the pods' loopback_bind.so"
}

# Isolated clusters (see the header): pod_ns.sh's hides, shared by every pod.
pod_hides() {
  local d
  POD_ARGS=(--hide /tmp)
  d=$(dirname "$ROOT")
  if [[ $d != /tmp && $d != / ]]; then POD_ARGS+=(--hide "$d"); fi
  if [[ -d /etc/slurm ]]; then POD_ARGS+=(--hide /etc/slurm); fi
}

# pod_dirs POD: its own log and run directories, bound at $ROOT/log and
# $ROOT/run; $ROOT/log/FILE links to each log file it names.
pod_dirs() {
  local pod=$ROOT/pods/$1 f; shift
  mkdir -p "$pod/log" "$pod/run"
  for f in "$@"; do ln -sfn "$pod/log/$f" "$ROOT/log/$f"; done
  POD_ARGS+=(--bind "$pod/log:$ROOT/log" --bind "$pod/run:$ROOT/run")
}

isolated() { [[ -f $ROOT/run/isolated ]]; }

start_ctld() {  # start_ctld [-c]
  local pod=()
  if isolated; then
    pod_hides
    pod_dirs slurmctld slurmctld.log
    POD_ARGS+=(--bind "$ROOT/etc:$ROOT/etc" --bind "$ROOT/state:$ROOT/state")
    if grep -qx AuthType=auth/slurm "$SLURM_CONF"; then
      mkdir -p /run/slurmctld
      POD_ARGS+=(--bind /run/slurmctld:/run/slurmctld)
    else
      POD_ARGS+=(--bind "$ROOT/munge/munge.socket.2:$ROOT/munge/munge.socket.2")
    fi
    pod=("$HERE/pod_ns.sh" "${POD_ARGS[@]}" --)
  fi
  "${pod[@]}" slurmctld -D "$@" -f "$SLURM_CONF" >>"$ROOT/log/slurmctld.stderr" 2>&1 &
  echo $! >"$ROOT/run/slurmctld.bgpid"
  wait_for 30 scontrol ping || { tail -20 "$ROOT/log/slurmctld.log" >&2; return 1; }
}

cmd_start() {
  set_root "$1"
  munged -F --socket="$ROOT/munge/munge.socket.2" --key-file="$ROOT/munge/munge.key" \
    --pid-file="$ROOT/munge/munged.pid" --seed-file="$ROOT/munge/munged.seed" \
    --log-file="$ROOT/log/munged.log" >"$ROOT/log/munged.stderr" 2>&1 &
  echo $! >"$ROOT/run/munged.bgpid"
  wait_for 10 test -S "$ROOT/munge/munge.socket.2"
  start_ctld -c
  # Watchdog: if the owner never calls stop, stop the cluster after lifetime.
  local self
  self=$(readlink -f "$0")
  (
    exec >/dev/null 2>&1 </dev/null
    sleep "$(cat "$ROOT/run/lifetime")" &
    sleep_pid=$!
    trap 'kill "$sleep_pid" 2>/dev/null; exit 0' TERM
    wait "$sleep_pid" && "$self" stop "$ROOT" --from-watchdog
  ) &
  echo $! >"$ROOT/run/watchdog.bgpid"
}

cmd_create() {
  set_root "$1"; local name=$2 idx=$3 attrs=$4
  # shellcheck disable=SC2086
  scontrol create NodeName="$name" NodeAddr="127.0.0.$idx" NodeHostname="127.0.0.$idx" \
    $attrs State=FUTURE
}

cmd_slurmd() {
  set_root "$1"; local name=$2 idx=$3 conf=$4; shift 4
  local ip=127.0.0.$idx l
  for l in "$@"; do
    grep -qxF "NodeName=$name $l" "$ROOT/etc/gres.conf" ||
      echo "NodeName=$name $l" >>"$ROOT/etc/gres.conf"
  done
  mkdir -p "$ROOT/spool/$name"
  unshare --uts sh -c "hostname $ip && LD_PRELOAD=$ROOT/lib/loopback_bind.so exec slurmd -D -Z -N $name --conf '$conf' -f $SLURM_CONF" \
    >>"$ROOT/log/slurmd-$name.stderr" 2>&1 &
  echo $! >"$ROOT/run/slurmd-$name.bgpid"
}

cmd_slurmd_configless() {
  set_root "$1"; local name=$2 idx=$3 conf=$4; shift 4
  local ip=127.0.0.$idx l added=0 port
  for l in "$@"; do
    if ! grep -qxF "NodeName=$name $l" "$ROOT/etc/gres.conf"; then
      echo "NodeName=$name $l" >>"$ROOT/etc/gres.conf"
      added=1
    fi
  done
  # configless slurmd gets gres.conf from slurmctld, which reads it again on
  # a reconfigure.
  if ((added)); then scontrol reconfigure >/dev/null; fi
  port=$(sed -n 's/^SlurmctldPort=//p' "$SLURM_CONF")
  mkdir -p "$ROOT/spool/$name"
  if isolated; then slurmd_pod "$name" "$ip" "$conf" "$port"; return; fi
  # The first config fetch is authenticated before slurmd has any config.
  # auth/slurm: slurmd finds the key through SLURM_SACK_KEY (Slinky mounts it
  # at /etc/slurm/slurm.key, the default). auth/munge: it needs this cluster's
  # munged at munge's default socket. On a host, a private mount namespace
  # gives it one (and its own /run/slurm, where configless slurmd may cache
  # its config). In a chroot (scripts/slurm-root.sh) "/" is no mount point,
  # so unshare cannot make mounts private: there the default socket becomes a
  # link to this cluster's munged (tests in a root run one at a time), never
  # over a real munged's socket.
  local run run_pre key_env=""
  if grep -qx AuthType=auth/slurm "$SLURM_CONF"; then
    key_env="SLURM_SACK_KEY=$ROOT/etc/slurm.key"
  fi
  if unshare --mount --uts true 2>/dev/null; then
    run="unshare --uts --mount sh -c"
    run_pre="mkdir -p /run/slurm /run/munge && mount -t tmpfs duet-slurmd /run/slurm &&
      mount --bind $ROOT/munge /run/munge &&"
  elif [[ -n $key_env ]]; then
    run="unshare --uts sh -c"
    run_pre=""
  else
    local sock=/run/munge/munge.socket.2
    if [[ -e $sock && ! -L $sock ]]; then
      die "slurmd-configless: $sock is a real munged's socket; not replacing it"
    fi
    mkdir -p /run/munge
    ln -sfn "$ROOT/munge/munge.socket.2" "$sock"
    run="unshare --uts sh -c"
    run_pre=""
  fi
  $run "$run_pre hostname $ip && unset SLURM_CONF &&
    $key_env LD_PRELOAD=$ROOT/lib/loopback_bind.so exec slurmd -D -Z -N $name \
      --conf-server 127.0.0.1:$port --conf '$conf'" \
    >>"$ROOT/log/slurmd-$name.stderr" 2>&1 &
  echo $! >"$ROOT/run/slurmd-$name.bgpid"
}

# slurmd_pod NAME IP CONF PORT: a configless slurmd in its NodeSet pod's
# namespace (the header's "Isolated clusters"); its PID is slurmd's.
slurmd_pod() {
  local name=$1 ip=$2 conf=$3 port=$4 key_env="" key d
  pod_hides
  pod_dirs "$name" "slurmd-$name.log"
  POD_ARGS+=(--bind "$ROOT/spool/$name:$ROOT/spool/$name" --bind "$ROOT/dev:$ROOT/dev"
             --bind "$ROOT/pods/lib:$ROOT/lib"
             --bind "$ROOT/etc/task_prolog.sh:$ROOT/etc/task_prolog.sh")
  if grep -qx AuthType=auth/slurm "$SLURM_CONF"; then
    key=/run/pod/etc-slurm/slurm.key
    if [[ -d /etc/slurm ]]; then key=/etc/slurm/slurm.key; fi
    POD_ARGS+=(--bind "$ROOT/etc/slurm.key:$key")
    key_env="SLURM_SACK_KEY=$key"
  else
    POD_ARGS+=(--bind "$ROOT/munge/munge.socket.2:/run/munge/munge.socket.2"
               --bind "$ROOT/munge/munge.socket.2:$ROOT/munge/munge.socket.2")
  fi
  for d in ${DUET_POD_SHARE:-}; do POD_ARGS+=(--bind "$d:$d"); done
  # The pod's /etc/hosts (kubelet's) names it at the pod's address. Its
  # hostname: its node's name, as a NodeSet pod's, where slurmctld takes a
  # dynamic node's NodeAddr from where it registers from (24.11+; two
  # slurmds named 127.0.0.N would share NodeHostName "127", which 25.11
  # cannot tell apart); before, NodeAddr is the hostname, which must then
  # be the address.
  printf '127.0.0.1\tlocalhost\n%s\t%s\n' "$ip" "$name" >"$ROOT/pods/$name/hosts"
  POD_ARGS+=(--bind "$ROOT/pods/$name/hosts:/etc/hosts")
  local host=$name ver
  ver=$(slurmd -V | awk '{print $2}')
  if ! printf '24.11\n%s\n' "$ver" | sort -V -C; then host=$ip; fi
  unshare --uts "$HERE/pod_ns.sh" "${POD_ARGS[@]}" -- sh -c "hostname $host && unset SLURM_CONF &&
    $key_env LD_PRELOAD=$ROOT/lib/loopback_bind.so exec slurmd -D -Z -N $name \
      --conf-server 127.0.0.1:$port --conf '$conf'" \
    >>"$ROOT/log/slurmd-$name.stderr" 2>&1 &
  echo $! >"$ROOT/run/slurmd-$name.bgpid"
}

cmd_slurmd_stop() { set_root "$1"; kill_pidfile "$ROOT/run/slurmd-$2.bgpid"; }

cmd_stop() {
  set_root "$1"
  if [[ ${2:-} != --from-watchdog ]]; then kill_pidfile "$ROOT/run/watchdog.bgpid"; fi
  if [[ -f $ROOT/run/slurmctld.bgpid ]] && scontrol ping >/dev/null 2>&1; then
    # Jobs first: a job whose slurmd is gone stays COMPLETING and its
    # slurmstepd outlives the slurmd.
    squeue -h -o %i | xargs -r scancel >/dev/null 2>&1 || true
    wait_for 10 sh -c '[ -z "$(squeue -h -o %i)" ]' || true
  fi
  local f
  for f in "$ROOT"/run/slurmd-*.bgpid; do kill_pidfile "$f"; done
  # slurmctld saves its state on SIGTERM (~3 s) and munged takes as long to
  # exit: stop both at once.
  kill_pidfile "$ROOT/run/slurmctld.bgpid" &
  kill_pidfile "$ROOT/run/munged.bgpid" &
  wait
  rm -f "$ROOT/run/watchdog.bgpid"
  # slurmd-configless's link in a chroot, if it is still this cluster's.
  if [[ $(readlink /run/munge/munge.socket.2 2>/dev/null) == "$ROOT/munge/munge.socket.2" ]]; then
    rm -f /run/munge/munge.socket.2
  fi
}

cmd_sackd() {
  command -v sackd >/dev/null || die "sackd: not installed (Slurm 23.11+, package sackd)"
  exec sackd -D -f "${1:?sackd: CONF missing}"
}

cmd_munged() {
  local key=${1:?munged: KEY missing}
  mkdir -p /run/munge
  exec munged -F --key-file="$key" --socket=/run/munge/munge.socket.2 \
    --pid-file=/run/munge/munged.pid --seed-file=/run/munge/munged.seed \
    --log-file=/run/munge/munged.log
}

cmd=${1:-}; shift || true
case $cmd in
  init) cmd_init "$@" ;;
  start) cmd_start "$@" ;;
  ctld-stop) set_root "$1"; kill_pidfile "$ROOT/run/slurmctld.bgpid" ;;
  ctld-start) set_root "$1"; start_ctld ;;
  ctld-kill)
    set_root "$1"
    pid=$(cat "$ROOT/run/slurmctld.bgpid" 2>/dev/null || true)
    if [[ -n $pid ]] && alive "$pid"; then
      kill -9 "$pid"
      for ((i = 0; i < 100; i++)); do alive "$pid" || break; sleep 0.05; done
    fi
    rm -f "$ROOT/run/slurmctld.bgpid" ;;
  create) cmd_create "$@" ;;
  slurmd) cmd_slurmd "$@" ;;
  slurmd-configless) cmd_slurmd_configless "$@" ;;
  slurmd-stop) cmd_slurmd_stop "$@" ;;
  stop) cmd_stop "$@" ;;
  env) set_root "$1"; echo "export SLURM_CONF=$SLURM_CONF" ;;
  sackd) cmd_sackd "$@" ;;
  munged) cmd_munged "$@" ;;
  *) die "usage: init|start|ctld-stop|ctld-start|ctld-kill|create|slurmd|slurmd-configless|slurmd-stop|stop|env|sackd|munged (see header)" ;;
esac
