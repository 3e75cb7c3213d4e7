#!/bin/bash
# pod_ns.sh - run a command as a pod's container sees the file system: in a
# fresh mount namespace with its own empty /run, the given directories
# hidden under empty tmpfs, and only the given paths bound back, e.g. the
# test cluster's root (and slurmctld's /run/slurmctld/sack.socket, the host's
# /run/munge) out of sight of a duet-bridge that should reach slurmctld only
# through what its pod mounts.
#
#   pod_ns.sh [--hide DIR]... [--bind SRC:DST]... -- CMD [ARGS...]
#
#   /run           always an empty tmpfs (mode 755), as a container's /run
#   --hide DIR     an empty tmpfs over DIR (which must exist), e.g. /tmp
#   --bind SRC:DST SRC (a file or directory, read before anything is hidden)
#                  at DST; DST's parent directories are made when missing,
#                  which must then lie in /run or a hidden DIR (nothing is
#                  created outside the namespace). A SRC under /run is the
#                  caller's (read through a descriptor of the caller's /run
#                  taken before the pod's /run replaces it), e.g.
#                  --bind /run/slurmctld:/run/slurmctld puts slurmctld's
#                  sack.socket where the caller's Slurm clients look
#
# CMD runs in the namespace, as the caller (root: unshare and mount need it)
# and in the caller's network and PID namespaces; it is exec'd, so its PID is
# this script's. Only the mount namespace is new: everything mounted here is
# gone when the last process in it exits.
#
# Mount propagation: by default unshare makes every mount private first, so
# nothing mounted here reaches the caller's namespace. In a chroot (as
# scripts/slurm-root.sh runs the tests) "/" is no mount point and that
# fails; there the namespace keeps the propagation it has, and the script
# refuses to go on if any mount it can see is shared (slurm-root.sh runs in a
# private namespace of its own, so none is).
set -euo pipefail

die() { echo "pod_ns.sh: $*" >&2; exit 2; }

if [[ ${DUET_POD_NS_INNER:-} != 1 ]]; then
  [[ $(id -u) == 0 ]] || die "needs root (unshare --mount)"
  self=$(readlink -f "$0")
  if unshare --mount true 2>/dev/null; then
    exec unshare --mount env DUET_POD_NS_INNER=1 "$self" "$@"
  fi
  exec unshare --mount --propagation unchanged env DUET_POD_NS_INNER=1 DUET_POD_NS_CHECK=1 \
    "$self" "$@"
fi
unset DUET_POD_NS_INNER

if [[ ${DUET_POD_NS_CHECK:-} == 1 ]]; then
  unset DUET_POD_NS_CHECK
  # Optional field "shared:N" (proc(5)): a mount here would propagate out.
  if grep -q ' shared:' /proc/self/mountinfo; then
    die "cannot make mounts private here and some are shared; not mounting anything"
  fi
fi

hide=()
binds=()
while (($#)); do
  case $1 in
    --hide) hide+=("$2"); shift 2 ;;
    --bind) binds+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) die "unknown argument $1 (see the header)" ;;
  esac
done
(($#)) || die "no command"

# 0. Sources under /run: reached through a descriptor of the caller's /run
#    (the path /proc/PID/fd/N/REST walks the old /run once the pod's own
#    hides it; mount -c keeps mount(8) from resolving it to the new one).
run_fd=""
for b in "${binds[@]}"; do
  case ${b%%:*} in /run | /run/*) exec {run_fd}</run; break ;; esac
done
# 1. The pod's own /run, and in it a staging place for every bound path,
#    taken while the paths are still visible.
mount -t tmpfs -o mode=755 duet-pod-run /run
mkdir /run/.pod-stage
i=0
for b in "${binds[@]}"; do
  src=${b%%:*}
  mount_opts=()
  case $src in
    /run | /run/*) src=/proc/$$/fd/$run_fd${src#/run}; mount_opts=(-c) ;;
  esac
  [[ -e $src ]] || die "--bind $b: ${b%%:*} does not exist"
  if [[ -d $src ]]; then mkdir "/run/.pod-stage/$i"; else : >"/run/.pod-stage/$i"; fi
  mount "${mount_opts[@]}" --bind "$src" "/run/.pod-stage/$i"
  i=$((i + 1))
done
if [[ -n $run_fd ]]; then exec {run_fd}<&-; fi
# 2. Hide.
for d in "${hide[@]}"; do
  [[ -d $d ]] || die "--hide $d: not a directory"
  mount -t tmpfs -o mode=1777 duet-pod-hide "$d"
done
# 3. Put each staged path where the pod has it.
i=0
for b in "${binds[@]}"; do
  dst=${b#*:}
  mkdir -p "$(dirname "$dst")"
  if [[ -d /run/.pod-stage/$i ]]; then mkdir -p "$dst"; else [[ -e $dst ]] || : >"$dst"; fi
  mount --move "/run/.pod-stage/$i" "$dst"
  i=$((i + 1))
done
rm -rf /run/.pod-stage
exec "$@"
