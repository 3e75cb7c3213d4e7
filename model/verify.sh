#!/usr/bin/env bash
# Model-checks model/duet.pml (or model/dra.pml) with spin: generates the
# verifier (spin -a), compiles it with gcc, runs an exhaustive search for
# assertion violations (the invariants) and invalid end states, and prints
# what it stored and found.
#
# Usage: model/verify.sh [--model duet|dra] [--expect I1|I2|I3] [--keep DIR]
#                        [-DNAME[=VALUE] ...]
#   --model NAME    which model: duet (default; the device-plugin mode's
#                   protocol) or dra (the DRA lending mode)
#   -DNAME[=VALUE]  passed to spin (model size, mutations: see model/README.md)
#   --expect INV    succeed only if spin finds a counterexample and the first
#                   one violates INV (a mutation test: the model can fail)
#   --keep DIR      work in DIR and keep the verifier and any trail there
#
# Exit status: 0 when the search completed without an error (or, with
# --expect, found a violation of INV); 1 otherwise; 2 on bad usage or a
# missing tool (spin, gcc).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=duet
expect=""
keep=""
defs=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --expect)
      [[ $# -ge 2 ]] || { echo "verify.sh: --expect needs I1, I2 or I3" >&2; exit 2; }
      case "$2" in I1|I2|I3) expect="$2" ;; *) echo "verify.sh: --expect $2: must be I1, I2 or I3" >&2; exit 2 ;; esac
      shift 2 ;;
    --model)
      [[ $# -ge 2 ]] || { echo "verify.sh: --model needs duet or dra" >&2; exit 2; }
      case "$2" in duet|dra) name="$2" ;; *) echo "verify.sh: --model $2: must be duet or dra" >&2; exit 2 ;; esac
      shift 2 ;;
    --keep)
      [[ $# -ge 2 ]] || { echo "verify.sh: --keep needs a directory" >&2; exit 2; }
      keep="$2"; shift 2 ;;
    -D*) defs+=("$1"); shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "verify.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

for tool in spin gcc; do
  if ! command -v "$tool" >/dev/null; then
    echo "verify.sh: '$tool' is not installed; scripts/deps.sh installs it (Debian package $tool)" >&2
    exit 2
  fi
done

if [[ -n "$keep" ]]; then
  mkdir -p "$keep"
  work="$(cd "$keep" && pwd)"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
pml="$name.pml"
cp "$here/$pml" "$work/$pml"
cd "$work"
rm -f "$pml.trail"

label="$name model${defs[*]:+ (${defs[*]})}"
start=$(date +%s.%N)
spin -a "${defs[@]}" "$pml" >spin.out 2>&1 || { cat spin.out >&2; echo "verify.sh: spin -a failed" >&2; exit 1; }
# SAFETY: assertions and end states only; COLLAPSE: lossless state
# compression (the search stays exhaustive); MEMLIM (MB) stops a run that
# would swap the machine instead of finishing.
# A mutation's counterexample is found within a small part of the state
# space: there compile time dominates, so pan is built unoptimized.
opt=-O2
if [[ -n "$expect" ]]; then opt=-O0; fi
gcc "$opt" -w -DSAFETY -DCOLLAPSE -DMEMLIM=4096 -o pan pan.c
set +e
./pan -m100000 -w24 >pan.out 2>&1
set -e
end=$(date +%s.%N)

num() { grep -E "$1" pan.out | head -1 | awk '{print $1}'; }
stored=$(num 'states, stored')
transitions=$(num 'transitions \(')
memory=$(grep -E 'total actual memory usage' pan.out | awk '{print $1}')
errors=$(grep -oE 'errors: [0-9]+' pan.out | awk '{print $2}')
depth=$(grep -oE 'depth reached [0-9]+' pan.out | awk '{print $3}')
seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
echo "$label: states stored ${stored:-?}, transitions ${transitions:-?}, depth ${depth:-?}," \
     "memory ${memory:-?} MB, ${seconds} s, errors ${errors:-?}"

incomplete=0
if [[ "${errors:-1}" == 0 ]] && grep -qE 'Search not completed|reached -DMEMLIM bound|max search depth too small' pan.out; then
  incomplete=1
  grep -E 'Search not completed|MEMLIM|max search depth' pan.out >&2 || true
fi

violated=""
if [[ "${errors:-1}" != 0 && -f "$pml.trail" ]]; then
  spin -t -p -g "${defs[@]}" "$pml" >trail.out 2>&1 || true
  # The monitor whose assert fired names the invariant.
  violated=$(grep -oE '\(CheckI[0-9]:[0-9]+\)[^[]*\[assert' trail.out | head -1 | grep -oE 'I[0-9]' || true)
  if [[ -z "$violated" ]] && grep -q 'invalid end state' pan.out; then violated="end state"; fi
  echo "$label: counterexample violates ${violated:-?} after $(grep -oE '^ *[0-9]+:' trail.out | sort -u | wc -l) steps;" \
       "its last steps that change the protocol's state:"
  # The steps that touch Slurm, the ledger, the journal, pods, steps, the
  # bridge's state and the calls (duet.pml), and claims, their writes, the
  # taints and the reclaim flags (dra.pml); bookkeeping of locals is left out.
  grep -E '^ *[0-9]+:[[:space:]]+proc' trail.out | grep -vE 'Check|:init:' |
    grep -E '[[](sl|led|jrn|kp|prun|srun|view|pend|lost|jans|rec|rel|taint|alloc|rv|infl|pod)\[[^]]*\] = |[[](up|epoch) = |(breq|hreq\[[a-z0-9]+\]|cw)[?!][a-z0-9]' |
    sed -E "s/ *\(state [0-9]+\)//; s/$name\.pml:[0-9]+ *//" | tail -60 | sed "s/^/  /"
  grep -A40 '^#processes' trail.out | grep -E '^\s+[a-z_]+(\[[0-9]+\])? = ' | grep -v ' = 0$' |
    sed 's/^\s*/  final: /' || true
fi

if [[ -n "$expect" ]]; then
  if [[ "$violated" == "$expect" ]]; then
    echo "$label: spin found the expected $expect violation"
    exit 0
  fi
  echo "$label: FAILED: expected a counterexample violating $expect, got '${violated:-none}'" >&2
  exit 1
fi
if [[ "${errors:-1}" != 0 || "$incomplete" == 1 ]]; then
  echo "$label: FAILED" >&2
  exit 1
fi
if [[ "$name" == dra ]]; then
  echo "$label: verified (I1 holds in every reachable state)"
else
  echo "$label: verified (I1, I2, I3 hold in every reachable state)"
fi
