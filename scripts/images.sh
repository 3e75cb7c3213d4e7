#!/usr/bin/env bash
# Builds duet's container images (docker/*.Dockerfile) with podman, offline,
# and smoke-runs them.
#
#   scripts/images.sh [trixie|forky|slurm2511|all] [duet|spank|all]   (default: all all)
#
# slurm2511 (spank only; not in "all"): the SPANK add-on for Slurm 25.11, the
# GKE Slurm add-on's release, which Debian does not package: built on bookworm
# (glibc 2.36, which the add-on's Ubuntu 24.04 slurmd image can load) against
# Slurm built from shared/slurm/src/slurm-25.11.7.tar.xz beside the clone
# ($DUET_SLURM_TARBALL overrides), copied into docker/slurm-src/ for the build.
#
# For each suite: a debootstrap --variant=minbase root from the host's Debian
# mirror, imported as localhost/debian:SUITE and localhost/debian:SUITE-slim
# (one image under both tags: minbase is already about as small as Debian's
# -slim image), then each Dockerfile built on it with BASE=localhost/debian,
# its apt steps reaching the mirror through the host's network. Images are
# tagged localhost/duet:VERSION-slurmX.Y / localhost/duet-spank:VERSION-slurmX.Y,
# X.Y being the libslurm the build stage got from the suite.
#
# Roots, logs and podman's settings live in $DUET_IMAGES (default
# /var/cache/duet/images), apart from scripts/slurm-root.sh's roots; a root is
# remade when missing or older than $DUET_ROOT_MAX_AGE_DAYS (default 14).
# A compile cache (ccache, a RUN --mount=type=cache) stays with podman between
# builds. Compile jobs: $DUET_JOBS (default 2). Needs root.
#
# Prints one line per image:  images SUITE IMAGE: TAG, N MB, built in N s, smoke ok
set -euo pipefail
cd "$(dirname "$0")/.."

SUITES=${1:-all}
KINDS=${2:-all}
[[ "$SUITES" == all ]] && SUITES="trixie forky"
[[ "$KINDS" == all ]] && KINDS="duet spank"
for s in $SUITES; do
  case "$s" in
    trixie | forky) ;;
    slurm2511) [[ "$KINDS" == "duet spank" ]] && KINDS=spank
      if [[ "$KINDS" != spank ]]; then
        echo "images: slurm2511 has only the spank image (duet-bridge: the trixie image serves 25.11)" >&2; exit 2
      fi ;;
    *) echo "images: unknown suite '$s' (trixie|forky|slurm2511|all)" >&2; exit 2 ;;
  esac
done
for k in $KINDS; do
  case "$k" in duet | spank) ;; *) echo "images: unknown image '$k' (duet|spank|all)" >&2; exit 2 ;; esac
done
if [[ $(id -u) -ne 0 ]]; then
  echo "images: needs root (debootstrap, podman's root storage)" >&2; exit 2
fi

DIR=${DUET_IMAGES:-/var/cache/duet/images}
MAX_AGE_DAYS=${DUET_ROOT_MAX_AGE_DAYS:-14}
JOBS=${DUET_JOBS:-2}
VERSION=$(sed -n 's/^project(duet VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
mkdir -p "$DIR/logs"

log() { echo "images: $*"; }

# The host's Debian mirror: scripts/slurm-root.sh's mirror(), so both make
# their roots from the same place.
eval "$(sed -n '/^mirror() {/,/^}/p' scripts/slurm-root.sh)"

# podman and runc from Debian, when missing.
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  log "installing podman, runc"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    podman runc debootstrap >"$DIR/logs/apt.log" 2>&1 || {
    tail -20 "$DIR/logs/apt.log" >&2
    echo "images: podman cannot be installed: no image built" >&2; exit 3
  }
fi
command -v debootstrap >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null

# podman's defaults do not run on these machines:
# - its default limits (nofile 1048576) are above this machine's hard limit,
#   and root here lacks CAP_SYS_RESOURCE, so the runtime's setrlimit fails
#   ("setrlimit `RLIMIT_NOFILE`: Operation not permitted"); the containers get
#   the caller's hard limits instead (nproc: podman caps its own at 32768);
# - the cgroups are hybrid (v1 controllers beside an empty v2), which crun
#   refuses ("cgroups in hybrid mode not supported"); runc runs there.
NOFILE=$(ulimit -Hn)
NPROC=$(ulimit -Hu)
[[ "$NPROC" == unlimited || "$NPROC" -gt 32768 ]] && NPROC=32768
[[ "$NOFILE" == unlimited ]] && NOFILE=1048576
cat >"$DIR/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$NOFILE:$NOFILE", "nproc=$NPROC:$NPROC"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$DIR/containers.conf

# The base image: a minbase root made once per suite, imported when the image
# is missing or older than the root.
base_image() {
  local suite=$1 root=$DIR/roots/$1 m stamp
  m=$(mirror)
  stamp=$(printf '%s\n' "$suite" "$m" | sha256sum | cut -c1-16)
  if [[ ! -f "$root/.duet-image-root" || "$(cat "$root/.duet-image-root")" != "$stamp" ||
    -n "$(find "$root/.duet-image-root" -mtime +"$MAX_AGE_DAYS")" ]]; then
    local t0=$SECONDS script=/usr/share/debootstrap/scripts/$suite
    # An older debootstrap has no script for a newer suite; sid's fits them all.
    [[ -e "$script" ]] || script=/usr/share/debootstrap/scripts/sid
    log "debootstrap --variant=minbase $suite from $m"
    rm -rf --one-file-system "$root" "$root.tmp"
    mkdir -p "$DIR/roots"
    debootstrap --variant=minbase "$suite" "$root.tmp" "$m" "$script" \
      >"$DIR/logs/$suite.debootstrap.log" 2>&1 || {
      tail -20 "$DIR/logs/$suite.debootstrap.log" >&2; exit 1
    }
    # A testing suite's Release on a snapshot mirror may be past its
    # Valid-Until; apt inside the builds must still take it.
    echo 'Acquire::Check-Valid-Until "false";' >"$root.tmp/etc/apt/apt.conf.d/99duet-mirror"
    # What debootstrap downloaded is not part of the image.
    rm -f "$root.tmp"/var/cache/apt/archives/*.deb
    rm -rf "$root.tmp"/var/lib/apt/lists/*
    echo "$stamp" >"$root.tmp/.duet-image-root"
    mv "$root.tmp" "$root"
    log "debootstrap $suite: $((SECONDS - t0)) s"
  fi
  local made
  made=$(podman image inspect --format '{{index .Labels "org.duet.root"}}' \
    "localhost/debian:$suite" 2>/dev/null || true)
  local want
  want=$stamp-$(stat -c %Y "$root/.duet-image-root")
  if [[ "$made" != "$want" ]]; then
    tar -C "$root" --exclude=./.duet-image-root -c . |
      podman import -q --change "LABEL org.duet.root=$want" --change 'CMD ["bash"]' \
        - "localhost/debian:$suite" >/dev/null
    log "imported localhost/debian:$suite ($(size_mb "localhost/debian:$suite") MB)"
  fi
  podman tag "localhost/debian:$suite" "localhost/debian:$suite-slim"
}

size_mb() { echo $(($(podman image inspect --format '{{.Size}}' "$1") / 1000000)); }

# A clear stop when podman cannot run a container here at all.
probe() {
  local err
  if ! err=$(podman run --rm --network none "localhost/debian:$1" true 2>&1); then
    echo "images: podman cannot run a container here: $err" >&2; exit 3
  fi
}

# The Debian suite an image suite is built on.
dist_of() { if [[ $1 == slurm2511 ]]; then echo bookworm; else echo "$1"; fi; }

# slurm2511: the Slurm source tarball, into the build context.
SLURM_CTX=docker/slurm-src
slurm_tarball() {
  local t=${DUET_SLURM_TARBALL:-$(dirname "$PWD")/shared/slurm/src/slurm-25.11.7.tar.xz}
  [[ -f "$t" ]] || { echo "images: no Slurm 25.11 source tarball at $t (set DUET_SLURM_TARBALL)" >&2; return 1; }
  mkdir -p "$SLURM_CTX"
  cp "$t" "$SLURM_CTX/"
  echo "$SLURM_CTX/$(basename "$t")"
}
trap 'rm -rf "$SLURM_CTX"' EXIT

build() {
  local suite=$1 kind=$2 file name t0=$SECONDS slurm tag
  case $kind in
    duet) file=docker/duet.Dockerfile; name=duet ;;
    spank) file=docker/spank.Dockerfile; name=duet-spank ;;
  esac
  local -a args=(--network host -f "$file" --build-arg BASE=localhost/debian
    --build-arg "SUITE=$(dist_of "$suite")" --build-arg "CMAKE_BUILD_PARALLEL_LEVEL=$JOBS")
  if [[ $suite == slurm2511 ]]; then
    local tarball
    tarball=$(slurm_tarball) || return 1
    args+=(--build-arg "SLURM_TARBALL=$tarball")
  fi
  local logf=$DIR/logs/$suite-$kind.build.log
  log "building $file on $suite (log: $logf)"
  # The build stage first, to read the Slurm release it got: that names the
  # image. The full build then reuses its layers.
  nice -n 10 podman build "${args[@]}" --target build -t "localhost/$name-build:$suite" . \
    >"$logf" 2>&1 || { tail -40 "$logf" >&2; return 1; }
  # X.Y from the installed headers' SLURM_VERSION_NUMBER (0xXXYYZZ): Debian's
  # libslurm-dev or Slurm built from source alike.
  slurm=$(podman run --rm --network none "localhost/$name-build:$suite" \
    sed -n 's/^#define SLURM_VERSION_NUMBER 0x\(..\)\(..\).*/\1 \2/p' /usr/include/slurm/slurm_version.h |
    { read -r maj min && printf '%d.%02d' "0x$maj" "0x$min"; }) || true
  if [[ -z "$slurm" ]]; then
    echo "images: no Slurm release in localhost/$name-build:$suite (log: $logf)" >&2; return 1
  fi
  tag=localhost/$name:$VERSION-slurm$slurm
  nice -n 10 podman build "${args[@]}" -t "$tag" . >>"$logf" 2>&1 || { tail -40 "$logf" >&2; return 1; }
  BUILT_S=$((SECONDS - t0))
  TAG=$tag
}

# run_in IMAGE CMD...: run CMD in a throwaway container of IMAGE, no network.
run_in() { local img=$1; shift; podman run --rm --network none "$img" "$@"; }

smoke_duet() {
  local img=$1 b out
  [[ "$(run_in "$img" id -u)" == 65532 ]] || { echo "images: $img does not run as 65532" >&2; return 1; }
  for b in duet-bridge duet-node duetctl; do
    run_in "$img" "$b" --help >/dev/null || { echo "images: $img: $b --help failed" >&2; return 1; }
  done
  # Every library of the binaries and of libslurm's dlopened plugins resolves.
  out=$(run_in "$img" sh -c 'for f in /usr/local/bin/* /usr/lib/*/slurm-wlm/auth_*.so; do
      echo "== $f"; ldd "$f"; done')
  if grep -q 'not found' <<<"$out"; then
    echo "images: $img: unresolved libraries:" >&2; grep -B50 'not found' <<<"$out" | grep -E '^==|not found' >&2
    return 1
  fi
  grep -q '^== /usr/lib/.*/auth_' <<<"$out" || { echo "images: $img: no libslurm auth plugins" >&2; return 1; }
}

smoke_spank() {
  local img=$1 out
  [[ "$(run_in "$img" id -u)" == 65532 ]] || { echo "images: $img does not run as 65532" >&2; return 1; }
  run_in "$img" test -f /opt/duet/lib/spank_duet.so -a -f /opt/duet/lib/duet_spank_client.so ||
    { echo "images: $img: the plugin or its client module is missing" >&2; return 1; }
  # The client module loads on the image's C library alone: every library it
  # needs resolves from /opt/duet/lib (RUNPATH $ORIGIN), and every symbol is
  # bound (ldd -r) but Slurm's own (slurm_*, spank_*), which slurmstepd, the
  # process that loads it, provides. spank_duet.so likewise: its libraries only.
  out=$(run_in "$img" ldd -r /opt/duet/lib/duet_spank_client.so 2>&1)
  if grep -E 'not found|undefined symbol' <<<"$out" | grep -Ev 'undefined symbol: (slurm|spank)_'; then
    echo "images: $img: duet_spank_client.so does not load (above)" >&2
    return 1
  fi
  grep -q '=> /opt/duet/lib/libgrpc' <<<"$out" ||
    { echo "images: $img: gRPC does not resolve from /opt/duet/lib" >&2; return 1; }
  out=$(run_in "$img" ldd /opt/duet/lib/spank_duet.so 2>&1)
  if grep -q 'not found' <<<"$out"; then
    echo "images: $img: spank_duet.so: $out" >&2; return 1
  fi
}

rc=0
summary=()
for suite in $SUITES; do
  base_image "$(dist_of "$suite")"
  probe "$(dist_of "$suite")"
  for kind in $KINDS; do
    if ! build "$suite" "$kind"; then
      summary+=("images $suite $kind: build failed (log: $DIR/logs/$suite-$kind.build.log)")
      rc=1; continue
    fi
    if "smoke_$kind" "$TAG"; then
      summary+=("images $suite $kind: $TAG, $(size_mb "$TAG") MB, built in $BUILT_S s, smoke ok")
    else
      summary+=("images $suite $kind: $TAG, $(size_mb "$TAG") MB, built in $BUILT_S s, smoke FAILED")
      rc=1
    fi
  done
done
printf '%s\n' "${summary[@]}"
exit "$rc"
