#!/usr/bin/env bash
# duet's Slurm-facing tests against a newer Slurm, in a Debian root.
#
#   scripts/slurm-root.sh SUITE [root|build|test|all] [CTEST ARGS]   (default: all)
#     SUITE  trixie (Slurm 24.11) | forky (Slurm 26.05)
#     root   make sure the root exists, up to date (debootstrap --variant=minbase
#            from the host's Debian mirror, plus the build and test packages)
#     build  configure and build, inside the root, only what the Slurm tests need
#     test   run them: ctest -L slurm (which holds the SPANK and the bridge's
#            Slurm end-to-end tests) against the root's slurmctld/slurmd/munged
#     all    root, build, test
#     run    CMD...: run a command in the root (as the tests see it), e.g.
#            scripts/slurm-root.sh forky run bash -c 'slurmd -V'
#
# Roots live outside the clone, in $DUET_ROOTS (default /var/cache/duet/roots),
# one per suite; the build dir and a ccache live inside the root, so a second
# run on the same machine reuses all three. A root is rebuilt when it is
# missing, half made, its package list changed, or older than
# $DUET_ROOT_MAX_AGE_DAYS (default 14). Needs root (debootstrap, chroot, mounts).
# The clone is bind-mounted read-only at /src inside the root and built in
# /var/build/duet; with DUET_ROOT_NAME=N, at /src-N and in /var/build/N, so that
# two clones (worktrees) can use one root at once. Every run makes its mounts
# in a private mount namespace: runs never unmount each other's. $DUET_JOBS
# (default: the CPUs) and $DUET_NICE (default 10) set the build's parallelism
# and nice level.
#
# Prints one summary line per run:  slurm-root SUITE (Slurm X.Y.Z): N tests, M passed
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)

SUITE=${1:?usage: scripts/slurm-root.sh trixie|forky [root|build|test|all] [ctest args]}
STEP=${2:-all}
shift $(($# < 2 ? $# : 2))
CTEST_ARGS=("$@")  # for test/all, e.g. -R SpankDuet
case "$SUITE" in
  trixie | forky | sid) ;;
  *) echo "slurm-root: unknown suite '$SUITE' (trixie|forky)" >&2; exit 2 ;;
esac
ROOTS=${DUET_ROOTS:-/var/cache/duet/roots}
NAME=${DUET_ROOT_NAME:-}
if [[ -n "$NAME" && ! "$NAME" =~ ^[A-Za-z0-9_-]+$ ]]; then
  echo "slurm-root: DUET_ROOT_NAME must be letters, digits, _ or -" >&2; exit 2
fi
RSRC=/src${NAME:+-$NAME}
RBUILD=/var/build/${NAME:-duet}
if [[ -z "${DUET_ROOT_NS:-}" ]]; then
  exec unshare -m --propagation private env DUET_ROOT_NS=1 "$SRC/scripts/slurm-root.sh" \
    "$SUITE" "$STEP" "$@"
fi
ROOT=$ROOTS/$SUITE
MAX_AGE_DAYS=${DUET_ROOT_MAX_AGE_DAYS:-14}
JOBS=${DUET_JOBS:-$(nproc)}
# The build's nice level: CI builds the roots at 19 while the host's tests run.
NICE=${DUET_NICE:-10}

# What the Slurm tests need to build and run (scripts/deps.sh's list, less what
# only other tests use, plus what minbase lacks: iproute2 for `ss`, bc for the
# bench smoke, ccache for reruns; sackd for the bridge's auth/slurm deployment
# test).
PACKAGES=(
  cmake ninja-build g++ pkg-config ccache ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  nlohmann-json3-dev libsimdjson-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
  libboost-dev libssl-dev libcurl4-openssl-dev
  libslurm-dev slurm-wlm-basic-plugins-dev slurmctld slurmd slurm-client sackd munge libmunge-dev
  python3 curl procps util-linux openssl iproute2 bc
)
# The ninja targets behind `ctest -L slurm`.
TARGETS=(
  libslurm_client_test slurm_sync_test munge_auth_test spank_duet_test
  slurm_e2e_test pod_e2e_test podlife_slurm_test slurm_bench_tool bridge_pod_auth_test
  duet-bridge duetctl spank_duet duet_spank_client
)

log() { echo "slurm-root $SUITE: $*"; }

# The host's Debian mirror (deb822 sources or the one-line format).
mirror() {
  local m=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    m=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources)
  fi
  if [[ -z "$m" && -f /etc/apt/sources.list ]]; then
    m=$(awk '/^deb / && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
      /etc/apt/sources.list)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

# apt in forky/sid: their Release files on a snapshot mirror may have expired.
APT_OPTS=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -q)

MOUNTED=()
mount_root() {
  local d
  for d in proc sys dev dev/pts; do
    mountpoint -q "$ROOT/$d" && continue
    case $d in
      proc) mount -t proc proc "$ROOT/proc" ;;
      # Recursive: slurmd needs the cgroup file system under /sys/fs/cgroup.
      sys) mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys" ;;
      dev) mount --bind /dev "$ROOT/dev" ;;
      dev/pts) mount -t devpts devpts "$ROOT/dev/pts" -o newinstance,ptmxmode=0666 ;;
    esac
    MOUNTED=("$ROOT/$d" "${MOUNTED[@]}")
  done
  # srun resolves this machine's name (its step listening socket): the root
  # gets the host's /etc/hosts, and the name on loopback if that lacks it.
  cp /etc/hosts "$ROOT/etc/hosts"
  chroot "$ROOT" getent hosts "$(hostname)" >/dev/null ||
    echo "127.0.1.1 $(hostname)" >>"$ROOT/etc/hosts"
  mkdir -p "$ROOT$RSRC"
  if ! mountpoint -q "$ROOT$RSRC"; then
    mount --bind "$SRC" "$ROOT$RSRC"
    mount -o remount,bind,ro "$ROOT$RSRC"
    MOUNTED=("$ROOT$RSRC" "${MOUNTED[@]}")
  fi
}
umount_root() {
  local m
  for m in "${MOUNTED[@]}"; do umount -R -l "$m" 2>/dev/null || true; done
  MOUNTED=()
}
trap umount_root EXIT

in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive CCACHE_DIR=/var/cache/ccache CCACHE_BASEDIR=$RSRC "$@"
}

stamp() { printf '%s\n' "$SUITE" "$(mirror)" "${PACKAGES[@]}" | sha256sum | cut -c1-16; }

root_is_fresh() {
  [[ -f "$ROOT/.duet-root" ]] || return 1
  [[ "$(cat "$ROOT/.duet-root")" == "$(stamp)" ]] || return 1
  [[ -z "$(find "$ROOT/.duet-root" -mtime +"$MAX_AGE_DAYS")" ]]
}

make_root() {
  if root_is_fresh; then
    log "root $ROOT is up to date"
    return
  fi
  local t0=$SECONDS m
  m=$(mirror)
  umount_root
  if [[ -e "$ROOT" ]]; then
    # Never rm through a live mount.
    for d in dev/pts dev proc sys $(cd "$ROOT" && ls -d src src-* 2>/dev/null); do
      if mountpoint -q "$ROOT/$d"; then umount -R -l "$ROOT/$d"; fi
    done
    rm -rf --one-file-system "$ROOT"
  fi
  mkdir -p "$ROOTS"
  log "debootstrap --variant=minbase $SUITE from $m"
  # An older debootstrap has no script for a newer suite; sid's fits them all.
  local script=/usr/share/debootstrap/scripts/$SUITE
  [[ -e "$script" ]] || script=/usr/share/debootstrap/scripts/sid
  rm -rf --one-file-system "$ROOT.tmp"
  debootstrap --variant=minbase "$SUITE" "$ROOT.tmp" "$m" "$script" >"$ROOTS/$SUITE.debootstrap.log" 2>&1 || {
    tail -20 "$ROOTS/$SUITE.debootstrap.log" >&2
    exit 1
  }
  mv "$ROOT.tmp" "$ROOT"
  log "debootstrap: $((SECONDS - t0)) s"
  local t1=$SECONDS
  mount_root
  in_root apt-get "${APT_OPTS[@]}" update
  # Daemons must not start inside the root while it is being set up.
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
  chmod +x "$ROOT/usr/sbin/policy-rc.d"
  in_root apt-get "${APT_OPTS[@]}" install -y "${PACKAGES[@]}" >"$ROOTS/$SUITE.apt.log" 2>&1 || {
    tail -30 "$ROOTS/$SUITE.apt.log" >&2
    exit 1
  }
  in_root apt-get clean
  log "apt install (${#PACKAGES[@]} packages): $((SECONDS - t1)) s"
  stamp >"$ROOT/.duet-root"
}

slurm_version() {
  in_root dpkg-query -W -f='${Version}' libslurm-dev 2>/dev/null | sed 's/-.*//'
}

build() {
  mount_root
  local t0=$SECONDS
  local -a werror=(-DDUET_WERROR=ON)
  in_root mkdir -p /var/cache/ccache /var/build
  local conf
  conf=$(in_root cmake -S $RSRC -B $RBUILD -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "${werror[@]}" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -Wno-dev 2>&1) || { echo "$conf" >&2; exit 1; }
  grep 'spank_duet: building for' <<<"$conf" || true
  log "configure: $((SECONDS - t0)) s"
  local t1=$SECONDS
  in_root nice -n "$NICE" cmake --build $RBUILD -j "$JOBS" --target "${TARGETS[@]}"
  log "build (${#TARGETS[@]} targets, Slurm $(slurm_version)): $((SECONDS - t1)) s"
}

run_tests() {
  mount_root
  local t0=$SECONDS rc=0 out
  out=$(mktemp)
  # The harness needs a UTS namespace per slurmd (unshare) and runs as root.
  in_root ctest --test-dir $RBUILD -L slurm --output-on-failure --timeout 900 \
    "${CTEST_ARGS[@]}" 2>&1 | tee "$out" || rc=$?
  local ran passed
  ran=$(sed -n 's/.* tests passed, [0-9]* tests failed out of \([0-9]*\)/\1/p' "$out" | tail -1)
  passed=$(sed -n 's/^[0-9]*% tests passed, \([0-9]*\) tests failed.*/\1/p' "$out" | tail -1)
  [[ -n "$ran" && -n "$passed" ]] && passed=$((ran - passed))
  rm -f "$out"
  log "ctest -L slurm: $((SECONDS - t0)) s"
  echo "slurm-root $SUITE (Slurm $(slurm_version)): ${ran:-0} tests, ${passed:-0} passed"
  return "$rc"
}

# (In braces: bash reads it whole, so editing this file cannot upset a run.)
{
case "$STEP" in
  root) make_root ;;
  build) build ;;
  test) run_tests ;;
  all) make_root; build; run_tests ;;
  run) mount_root; in_root "${CTEST_ARGS[@]}" ;;
  *) echo "slurm-root: unknown step '$STEP' (root|build|test|all|run)" >&2; exit 2 ;;
esac
exit
}
