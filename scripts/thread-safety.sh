#!/usr/bin/env bash
# Builds duet's libraries and binaries with clang and -Wthread-safety -Werror,
# so every ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED is checked.
set -euo pipefail
cd "$(dirname "$0")/.."
CC=clang CXX=clang++ cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DDUET_WERROR=ON -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF >/dev/null
cmake --build build-clang
