#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz): builds them in build-fuzz with clang,
# ASan/UBSan and libFuzzer, then runs each for SECONDS (default 20) over a
# copy of its seed corpus (tests/fuzz/corpus/<name>), printing per target the
# executions run and whether it crashed. Crash inputs are kept in
# build-fuzz/fuzz-out/<name>/. Exit status 1 when any target crashed.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]        build the targets, run them
#   scripts/fuzz.sh build                        build every target, check every file
#   scripts/fuzz.sh run [SECONDS] [TARGET...]    run what `build` built
#
# e.g. scripts/fuzz.sh 3600 quantity. TARGET is the name without _fuzz
# (quantity, pod_request, ...); none = all. `build` builds every fuzz target
# and then runs clang's front end (-fsyntax-only, scripts/front-end-check.py)
# over every other file of every library and binary with its own flags:
# build-fuzz is configured with DUET_WERROR=ON, so -Wthread-safety checks every
# lock annotation (what scripts/thread-safety.sh does with a whole build) and
# CI needs one clang configuration for both, without compiling with ASan what
# no fuzz target runs (ASan's code generation is about 5/6 of a file's time).
# DUET_JOBS (default 2) and DUET_NICE (default 15) set the build's
# parallelism and nice level.
set -euo pipefail
cd "$(dirname "$0")/.."
step=both
case "${1:-}" in
  build|run) step=$1; shift ;;
esac
secs="${1:-20}"
shift || true
all=()
for f in tests/fuzz/*_fuzz.cc; do
  n="$(basename "$f" .cc)"
  all+=("${n%_fuzz}")
done
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
nice_level="${DUET_NICE:-15}"

if [[ $step != run ]]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  # -O1 with line tables only: enough for libFuzzer's speed and for crash
  # stacks with file:line, cheaper to compile than -O2 -g (CI's 2 cores build
  # this beside everything else).
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
    -DDUET_FUZZ=ON -DDUET_WERROR=ON -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF \
    "${launcher[@]}" >/dev/null
  build=(--target duet_fuzz_all)
  if [[ $step == both ]]; then
    build=()
    for t in "${targets[@]}"; do build+=(--target "${t}_fuzz"); done
  fi
  t0=$SECONDS
  nice -n "$nice_level" cmake --build build-fuzz -j "${DUET_JOBS:-2}" "${build[@]}"
  echo "fuzz: build $((SECONDS - t0)) s"
  if [[ $step == build ]]; then
    # Every other file of every library and binary through clang's front end
    # only, with its own flags: the same warnings, -Wthread-safety's among
    # them, under -Werror, without ASan's code generation.
    t0=$SECONDS
    nice -n "$nice_level" python3 scripts/front-end-check.py build-fuzz duet_fuzz_all "${DUET_JOBS:-2}"
    echo "fuzz: front-end check of the other files $((SECONDS - t0)) s"
    exit 0
  fi
fi

failed=0
for t in "${targets[@]}"; do
  bin="build-fuzz/tests/fuzz/${t}_fuzz"
  if [[ ! -x $bin ]]; then
    echo "$t: no such target ($bin; run scripts/fuzz.sh build first)" >&2
    failed=1
    continue
  fi
  out="build-fuzz/fuzz-out/$t"
  rm -rf "$out"
  mkdir -p "$out/corpus" "$out/crashes"
  cp -r "tests/fuzz/corpus/$t/." "$out/corpus/" 2>/dev/null || true
  set +e
  nice -n "$nice_level" "$bin" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$out/crashes/" -rss_limit_mb=2048 "$out/corpus" >"$out/log" 2>&1
  rc=$?
  set -e
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log" | tail -1)"
  if [ "$rc" -eq 0 ]; then
    echo "$t: ${execs:-?} executions in ${secs} s, no crash"
  else
    failed=1
    echo "$t: ${execs:-?} executions, CRASHED (exit $rc): $(ls "$out/crashes" | tr '\n' ' ')"
    echo "  log: $out/log"
    tail -40 "$out/log" | sed 's/^/  | /'
  fi
done
exit "$failed"
