#!/usr/bin/env bash
# Compiles duet's libslurm users (bridge/slurm/libslurm_client.cc,
# slurm_plugin/remote.cc) with -Werror against another Slurm release's public
# headers, in the trixie root of scripts/slurm-root.sh (which must be built:
# `scripts/slurm-root.sh trixie root && scripts/slurm-root.sh trixie build`).
# For a release Debian does not package, e.g. 25.11 (the GKE Slurm add-on):
#
#   scripts/slurm-headers-check.sh DIR 0x190b07
#     DIR: a Slurm source tree's slurm/ folder (slurm.h, slurm_errno.h, spank.h,
#          slurmdb.h, slurm_version.h.in), e.g. from `git show TAG:slurm/...`
#     0x190b07: its SLURM_VERSION_NUMBER (25.11.7)
#
# Only compiles: no daemons of that release run here.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: scripts/slurm-headers-check.sh SLURM_HEADER_DIR SLURM_VERSION_NUMBER}
NUM=${2:?usage: scripts/slurm-headers-check.sh SLURM_HEADER_DIR SLURM_VERSION_NUMBER}
ROOT=${DUET_ROOTS:-/var/cache/duet/roots}/trixie
BUILD=$ROOT/var/build/duet
[[ -f $BUILD/compile_commands.json ]] || { echo "build the trixie root first (see above)" >&2; exit 1; }
INC=$ROOT/opt/slurm-headers-check
rm -rf "$INC"; mkdir -p "$INC/slurm"
cp "$DIR"/{slurm.h,slurm_errno.h,slurmdb.h,spank.h} "$INC/slurm/"
sed "s/^#undef SLURM_VERSION_NUMBER/#define SLURM_VERSION_NUMBER $NUM/" "$DIR/slurm_version.h.in" \
  >"$INC/slurm/slurm_version.h"
# The build's own compile lines, with these headers searched first.
python3 - "$BUILD/compile_commands.json" >"$ROOT/tmp/slurm-headers-check.sh" <<'PY'
import json, re, sys
print("set -e")
for e in json.load(open(sys.argv[1])):
    if e["file"].endswith(("bridge/slurm/libslurm_client.cc", "slurm_plugin/remote.cc")):
        cmd = e["command"].replace("/usr/bin/ccache ", "").replace("ccache ", "")
        exe, rest = cmd.split(" ", 1)
        rest = re.sub(r" -o \S+", " -o /dev/null", rest)
        rest = re.sub(r" -MD -MT \S+ -MF \S+", "", rest)
        print(f"cd {e['directory']} && {exe} -I/opt/slurm-headers-check {rest}")
        print(f"echo 'compiled {e['file']}'")
PY
printf '%s\n' \
  "printf '#include \"common/slurm/slurm_compat.h\"\\nstatic_assert(SLURM_VERSION_NUMBER == $NUM, \"headers\");\\n' |" \
  "  c++ -x c++ -std=c++17 -I/opt/slurm-headers-check -I/src -fsyntax-only -" \
  "echo 'slurm_compat.h saw SLURM_VERSION_NUMBER $NUM'" >>"$ROOT/tmp/slurm-headers-check.sh"
mkdir -p "$ROOT/src"
if ! mountpoint -q "$ROOT/src"; then
  mount --bind "$(pwd)" "$ROOT/src"
  trap 'umount -l "$ROOT/src"' EXIT
fi
chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin bash /tmp/slurm-headers-check.sh
