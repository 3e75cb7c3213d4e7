#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) in build-fuzz with clang,
# ASan/UBSan and libFuzzer, then runs each for SECONDS (default 20) over a
# copy of its seed corpus (tests/fuzz/corpus/<name>), printing per target the
# executions run and whether it crashed. Crash inputs are kept in
# build-fuzz/fuzz-out/<name>/. Exit status 1 when any target crashed.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 3600 quantity
#
# TARGET is the name without _fuzz (quantity, pod_request, ...); none = all.
# JOBS (default 2) bounds the build's parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"
shift || true
all=()
for f in tests/fuzz/*_fuzz.cc; do
  n="$(basename "$f" .cc)"
  all+=("${n%_fuzz}")
done
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDUET_FUZZ=ON -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF >/dev/null
build=()
for t in "${targets[@]}"; do build+=("${t}_fuzz"); done
nice -n 15 cmake --build build-fuzz -j "${JOBS:-2}" --target "${build[@]}"

failed=0
for t in "${targets[@]}"; do
  out="build-fuzz/fuzz-out/$t"
  rm -rf "$out"
  mkdir -p "$out/corpus" "$out/crashes"
  cp -r "tests/fuzz/corpus/$t/." "$out/corpus/" 2>/dev/null || true
  set +e
  nice -n 15 "build-fuzz/tests/fuzz/${t}_fuzz" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$out/crashes/" -rss_limit_mb=2048 "$out/corpus" >"$out/log" 2>&1
  rc=$?
  set -e
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log" | tail -1)"
  if [ "$rc" -eq 0 ]; then
    echo "$t: ${execs:-?} executions, no crash"
  else
    failed=1
    echo "$t: ${execs:-?} executions, CRASHED (exit $rc): $(ls "$out/crashes" | tr '\n' ' ')"
    echo "  log: $out/log"
  fi
done
exit "$failed"
