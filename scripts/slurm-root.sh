#!/usr/bin/env bash
# duet's Slurm-facing tests against a newer Slurm, in a Debian root.
#
#   scripts/slurm-root.sh SUITE [root|build|test|all] [CTEST ARGS]   (default: all)
#     SUITE  trixie (Slurm 24.11) | forky (Slurm 26.05) | slurm2511 (Slurm 25.11.7,
#            the GKE Slurm add-on's release, which Debian does not package: a
#            trixie root without Debian's Slurm, Slurm built from source in it)
#     root   make sure the root exists, up to date (debootstrap --variant=minbase
#            from the host's Debian mirror, plus the build and test packages;
#            slurm2511: a copy of an up-to-date trixie root when there is one,
#            Debian's Slurm purged, or else debootstrap; then Slurm's configure,
#            make -j$DUET_JOBS, make install in Debian's layout: plugins in
#            /usr/lib/x86_64-linux-gnu/slurm-wlm, so auth/slurm and sackd are there)
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
# $DUET_ROOT_MAX_AGE_DAYS (default 14); slurm2511's also when the Slurm
# tarball's sha256 or Slurm's configure flags changed, else its Slurm build is
# skipped. The tarball: shared/slurm/src/slurm-25.11.7.tar.xz beside the clone
# (../shared), or $DUET_SLURM_TARBALL; its sha256 must be $DUET_SLURM_SHA256
# (default the 25.11.7 one; empty: any). Needs root (debootstrap, chroot, mounts).
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

SUITE=${1:?usage: scripts/slurm-root.sh trixie|forky|slurm2511 [root|build|test|all] [ctest args]}
STEP=${2:-all}
shift $(($# < 2 ? $# : 2))
CTEST_ARGS=("$@")  # for test/all, e.g. -R SpankDuet
# DIST: the Debian release the root is made of.
case "$SUITE" in
  trixie | forky | sid) DIST=$SUITE ;;
  slurm2511) DIST=trixie ;;
  *) echo "slurm-root: unknown suite '$SUITE' (trixie|forky|slurm2511)" >&2; exit 2 ;;
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
# test: Debian's, or slurm2511's own build).
BASE_PACKAGES=(
  cmake ninja-build g++ pkg-config ccache ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  nlohmann-json3-dev libsimdjson-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
  libboost-dev libssl-dev libcurl4-openssl-dev
)
TAIL_PACKAGES=(munge libmunge-dev python3 curl procps util-linux openssl iproute2 bc)
DEBIAN_SLURM=(libslurm-dev slurm-wlm-basic-plugins-dev slurmctld slurmd slurm-client sackd)
# slurm2511: Slurm's own build needs make and, for auth/slurm (and cred/slurm),
# libjwt-dev: without it configure silently leaves auth_slurm.so out. 25.11's
# slurmctld will not start without serializer/json (libjson-c-dev: "fatal:
# serializer_required: could not find plugin for application/json") and looks
# for url_parser/http_parser (libhttp-parser-dev).
SLURM_BUILD_PACKAGES=(make libjwt-dev libjson-c-dev libhttp-parser-dev)
debian_packages() { echo "${BASE_PACKAGES[@]}" "${DEBIAN_SLURM[@]}" "${TAIL_PACKAGES[@]}"; }
if [[ $SUITE == slurm2511 ]]; then
  PACKAGES=("${BASE_PACKAGES[@]}" "${SLURM_BUILD_PACKAGES[@]}" "${TAIL_PACKAGES[@]}")
else
  read -ra PACKAGES <<<"$(debian_packages)"
fi

# slurm2511: Slurm 25.11.7 (the GKE Slurm Operator add-on's release; Debian
# packages no 25.11) built from SchedMD's source inside the root, in Debian's
# layout (plugins in /usr/lib/<triplet>/slurm-wlm, as the harness expects).
# The tarball sits in shared/ beside the clone ($DUET_SLURM_TARBALL overrides;
# $DUET_SLURM_SHA256 too, empty to skip the check).
SLURM_TARBALL=${DUET_SLURM_TARBALL:-$(dirname "$SRC")/shared/slurm/src/slurm-25.11.7.tar.xz}
SLURM_SHA256=${DUET_SLURM_SHA256-f71f1e5f33a72e7864104a6857e86862eac3c4e5e348c92dd0c10dbe03a82dec}
SLURM_LIBDIR=/usr/lib/x86_64-linux-gnu
SLURM_CONFIGURE=(--prefix=/usr --sysconfdir=/etc/slurm --libdir=$SLURM_LIBDIR
  --localstatedir=/var --runstatedir=/run --with-munge=/usr --with-jwt=/usr)
SLURM_MAKE=(pkglibdir=$SLURM_LIBDIR/slurm-wlm)
# The ninja targets behind `ctest -L slurm`.
TARGETS=(
  libslurm_client_test slurm_sync_test munge_auth_test spank_duet_test
  slurm_e2e_test pod_e2e_test podlife_slurm_test slurm_bench_tool bridge_pod_auth_test slurm_policy_test
  deployment_e2e_test dra_e2e_test dra_gang_e2e_test gang_e2e_test tpu_slice_e2e_test slurm_topology_test step_agent_e2e_test
  duet-bridge duetctl duet-node spank_duet duet_spank_client bench_empty_spank
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

# A root's stamp: what it was made of. slurm2511's also names the Slurm
# tarball (its sha256) and how Slurm was configured, so a new tarball or new
# flags make a new root, and an unchanged one skips the Slurm build.
stamp_of() {  # stamp_of SUITE PACKAGE...
  local suite=$1 extra=()
  shift
  if [[ $suite == slurm2511 ]]; then
    extra=("$(slurm_tarball_sha)" "${SLURM_CONFIGURE[@]}" "${SLURM_MAKE[@]}")
  fi
  printf '%s\n' "$suite" "$(mirror)" "$@" "${extra[@]}" | sha256sum | cut -c1-16
}
stamp() { stamp_of "$SUITE" "${PACKAGES[@]}"; }

SLURM_SHA=""
slurm_tarball_sha() {
  if [[ -n "$SLURM_SHA" ]]; then echo "$SLURM_SHA"; return; fi
  if [[ ! -f "$SLURM_TARBALL" ]]; then
    echo "slurm-root $SUITE: the Slurm 25.11 source tarball $SLURM_TARBALL is missing" \
      "(shared/slurm/src/ beside the clone; set DUET_SLURM_TARBALL to its path)" >&2
    exit 1
  fi
  local sha
  sha=$(sha256sum "$SLURM_TARBALL" | cut -d' ' -f1)
  if [[ -n "$SLURM_SHA256" && "$sha" != "$SLURM_SHA256" ]]; then
    echo "slurm-root $SUITE: $SLURM_TARBALL has sha256 $sha, expected $SLURM_SHA256" \
      "(DUET_SLURM_SHA256= to accept another tarball)" >&2
    exit 1
  fi
  echo "$sha"
}

root_is_fresh() {
  [[ -f "$ROOT/.duet-root" ]] || return 1
  [[ "$(cat "$ROOT/.duet-root")" == "$(stamp)" ]] || return 1
  [[ -z "$(find "$ROOT/.duet-root" -mtime +"$MAX_AGE_DAYS")" ]]
}

# Remove $1 (a root or a half-made one), never through a live mount.
remove_root() {
  local r=$1 d
  [[ -e "$r" ]] || return 0
  for d in dev/pts dev proc sys $(cd "$r" && ls -d src src-* 2>/dev/null); do
    if mountpoint -q "$r/$d"; then umount -R -l "$r/$d"; fi
  done
  rm -rf --one-file-system "$r"
}

debootstrap_root() {
  local t0=$SECONDS m
  m=$(mirror)
  log "debootstrap --variant=minbase $DIST from $m"
  # An older debootstrap has no script for a newer suite; sid's fits them all.
  local script=/usr/share/debootstrap/scripts/$DIST
  [[ -e "$script" ]] || script=/usr/share/debootstrap/scripts/sid
  remove_root "$ROOT.tmp"
  debootstrap --variant=minbase "$DIST" "$ROOT.tmp" "$m" "$script" >"$ROOTS/$SUITE.debootstrap.log" 2>&1 || {
    tail -20 "$ROOTS/$SUITE.debootstrap.log" >&2
    exit 1
  }
  mv "$ROOT.tmp" "$ROOT"
  log "debootstrap: $((SECONDS - t0)) s"
}

# slurm2511 from a copy of an up-to-date trixie root (CI makes that one first):
# its base system and duet's build packages are the same; Debian's Slurm
# 24.11 packages come out. Fails (and the caller debootstraps) when there is
# no such root or Slurm packages stay behind.
seed_from_trixie() {
  local src=$ROOTS/trixie t0=$SECONDS
  [[ $SUITE == slurm2511 && -f "$src/.duet-root" ]] || return 1
  local want
  read -ra want <<<"$(debian_packages)"
  [[ "$(cat "$src/.duet-root")" == "$(stamp_of trixie "${want[@]}")" ]] || return 1
  log "copying the trixie root $src"
  remove_root "$ROOT.tmp"
  mkdir -p "$ROOT.tmp"
  # Not its mounts, builds or ccache (other clones may be using it now).
  tar -C "$src" --one-file-system --xattrs --exclude=./var/build --exclude=./var/cache/ccache \
    --exclude='./src-*' -cf - . | tar -C "$ROOT.tmp" --xattrs -xpf - || { remove_root "$ROOT.tmp"; return 1; }
  rm -f "$ROOT.tmp/.duet-root"
  mkdir -p "$ROOT.tmp/src"
  chroot "$ROOT.tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get purge -y -q "$@" && apt-get autoremove --purge -y -q' sh "${DEBIAN_SLURM[@]}" \
    >"$ROOTS/$SUITE.purge.log" 2>&1 || { tail -20 "$ROOTS/$SUITE.purge.log" >&2; remove_root "$ROOT.tmp"; return 1; }
  local left
  left=$(chroot "$ROOT.tmp" dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' '*slurm*' 2>/dev/null |
    awk '$1 != "un" && $1 != "pn" {print $2}' | tr '\n' ' ')
  if [[ -n "$left" || -e "$ROOT.tmp$SLURM_LIBDIR/slurm-wlm" ]]; then
    log "Debian Slurm left in the copy ($left): debootstrapping instead"
    remove_root "$ROOT.tmp"
    return 1
  fi
  mv "$ROOT.tmp" "$ROOT"
  log "copy of trixie, Debian's Slurm purged: $((SECONDS - t0)) s"
}

# Configure, build and install Slurm from $SLURM_TARBALL inside the root, as
# Debian lays it out (binaries in /usr, plugins and libslurmfull in
# $SLURM_LIBDIR/slurm-wlm, which also becomes the default PluginDir).
build_slurm() {
  local t0=$SECONDS sha dir=/var/build/slurm-src blog=$ROOTS/$SUITE.slurm-build.log
  sha=$(slurm_tarball_sha)
  rm -rf --one-file-system "$ROOT$dir"
  mkdir -p "$ROOT$dir"
  tar -C "$ROOT$dir" --strip-components=1 -xJf "$SLURM_TARBALL"
  log "Slurm from $SLURM_TARBALL (sha256 ${sha:0:16}), log: $blog"
  fail() { tail -30 "$blog" >&2; log "Slurm $1 failed (the whole log: $blog)" >&2; exit 1; }
  in_root bash -c 'cd "$1" && shift && exec "$@"' - "$dir" nice -n "$NICE" \
    ./configure "${SLURM_CONFIGURE[@]}" >"$blog" 2>&1 || fail configure
  log "Slurm configure: $((SECONDS - t0)) s"
  local t1=$SECONDS
  in_root bash -c 'cd "$1" && shift && exec "$@"' - "$dir" nice -n "$NICE" \
    make -j"$JOBS" "${SLURM_MAKE[@]}" >>"$blog" 2>&1 || fail make
  log "Slurm make -j$JOBS: $((SECONDS - t1)) s"
  t1=$SECONDS
  in_root bash -c 'cd "$1" && shift && exec "$@"' - "$dir" nice -n "$NICE" \
    make install "${SLURM_MAKE[@]}" >>"$blog" 2>&1 || fail "make install"
  in_root ldconfig
  rm -rf --one-file-system "$ROOT$dir"
  log "Slurm make install: $((SECONDS - t1)) s"
  # What the tests rely on: auth/slurm (auth_slurm.so, which is cred/slurm too;
  # only built with libjwt), sackd.
  local f
  for f in "$SLURM_LIBDIR/slurm-wlm/auth_slurm.so" /usr/sbin/slurmctld /usr/sbin/slurmd \
    /usr/sbin/slurmstepd /usr/sbin/sackd /usr/bin/scontrol /usr/include/slurm/spank.h; do
    [[ -e "$ROOT$f" ]] || { log "Slurm installed no $f" >&2; exit 1; }
  done
  log "Slurm $(slurm_version) built and installed: $((SECONDS - t0)) s"
}

make_root() {
  # (Here, not in the $(stamp) below, so that a missing tarball stops the run.)
  [[ $SUITE != slurm2511 ]] || SLURM_SHA=$(slurm_tarball_sha)
  if root_is_fresh; then
    log "root $ROOT is up to date"
    return
  fi
  umount_root
  remove_root "$ROOT"
  mkdir -p "$ROOTS"
  seed_from_trixie || debootstrap_root
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
  [[ $SUITE != slurm2511 ]] || build_slurm
  stamp >"$ROOT/.duet-root"
}

# The Slurm release in the root: Debian's package, or (slurm2511, built from
# source, no package) what slurmctld says it is.
slurm_version() {
  if [[ $SUITE == slurm2511 ]]; then
    in_root slurmctld -V 2>/dev/null | awk '{print $2}'
  else
    in_root dpkg-query -W -f='${Version}' libslurm-dev 2>/dev/null | sed 's/-.*//'
  fi
}

build() {
  mount_root
  local t0=$SECONDS
  local -a werror=(-DDUET_WERROR=ON)
  in_root mkdir -p /var/cache/ccache /var/build
  # slurm2511 is trixie with another Slurm: the same compiler and headers but
  # Slurm's, so it compiles into trixie's ccache (CI builds trixie first) and
  # recompiles only what includes slurm.h. (ccache keys on the compiler and
  # every header's content, so nothing of 24.11 can come back.)
  local shared_cc=$ROOTS/trixie/var/cache/ccache
  if [[ $SUITE == slurm2511 && -d "$shared_cc" ]] && ! mountpoint -q "$ROOT/var/cache/ccache"; then
    mount --bind "$shared_cc" "$ROOT/var/cache/ccache"
    MOUNTED=("$ROOT/var/cache/ccache" "${MOUNTED[@]}")
    log "sharing trixie's ccache ($shared_cc)"
  fi
  in_root ccache --zero-stats >/dev/null 2>&1 || true
  local conf
  # -O0 without debug info: these builds exist to run the Slurm tests against
  # another Slurm, which wait on slurmctld, not on the CPU; about a third less
  # compile time than -O2 -g (slurm_sync.cc: 27-38 s against 50-52 s here),
  # and CI's 2 cores are its bottleneck.
  conf=$(in_root cmake -S $RSRC -B $RBUILD -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DCMAKE_C_FLAGS_DEBUG=-O0 \
    "${werror[@]}" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -Wno-dev 2>&1) || { echo "$conf" >&2; exit 1; }
  grep 'spank_duet: building for' <<<"$conf" || true
  log "configure: $((SECONDS - t0)) s"
  local t1=$SECONDS
  in_root nice -n "$NICE" cmake --build $RBUILD -j "$JOBS" --target "${TARGETS[@]}"
  log "build (${#TARGETS[@]} targets, Slurm $(slurm_version)): $((SECONDS - t1)) s," \
    "ccache $(in_root ccache --print-stats 2>/dev/null |
      awk -F'\t' '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" {h += $2}
        $1 == "cache_miss" {m = $2} END {printf "%d hits, %d misses", h, m}')"
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
