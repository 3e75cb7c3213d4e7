# duet-bridge, duet-node and duetctl for one Slurm line. The Debian suite
# picks libslurm: trixie = Slurm 24.11 (talks to slurmctld 24.11 to 25.11,
# the GKE add-on's 25.11 included), forky = 26.05. Build from the repository
# root (docker/README.md):
#   docker build -f docker/duet.Dockerfile --build-arg SUITE=trixie -t duet:0.1.0-slurm24.11 .
#   docker build -f docker/duet.Dockerfile --build-arg SUITE=forky  -t duet:0.1.0-slurm26.05 .
# BASE: where the Debian images come from; scripts/images.sh builds with
# BASE=localhost/debian, images it makes offline with debootstrap.
# CMAKE_BUILD_PARALLEL_LEVEL (a build arg, seen by cmake as an environment
# variable) caps the compile jobs on a small builder.
ARG SUITE=trixie
ARG BASE=debian

FROM ${BASE}:${SUITE} AS build
ARG DEBIAN_FRONTEND=noninteractive
# The build packages of scripts/deps.sh, without the test-only ones.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      cmake ninja-build g++ pkg-config ccache ca-certificates \
      libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev \
      nlohmann-json3-dev libsimdjson-dev zlib1g-dev libboost-dev libssl-dev \
      libslurm-dev slurm-wlm-basic-plugins-dev libmunge-dev libcurl4-openssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG CMAKE_BUILD_PARALLEL_LEVEL
# ccache in a cache mount (kept by the builder between builds, never in the
# image): a rebuild after a source change recompiles only what changed; the
# build log shows this build's hits and misses.
RUN --mount=type=cache,target=/var/cache/ccache \
    export CCACHE_DIR=/var/cache/ccache CCACHE_BASEDIR=/src \
 && ccache --zero-stats >/dev/null \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache \
 && cmake --build /build --target duet-bridge duet-node duetctl \
 && ccache --show-stats \
 && mkdir -p /out/bin \
 && cp /build/bridge/server/duet-bridge /build/k8s_adapter/device_plugin/duet-node \
       /build/duetctl/duetctl /out/bin/ \
 && strip --strip-debug /out/bin/* \
 && /out/bin/duet-bridge --help >/dev/null && /out/bin/duet-node --help >/dev/null
# The runtime packages: whatever Debian package owns each shared library the
# binaries load (names differ between suites, so they are looked up here);
# libslurm's own plugins (auth/munge, auth/slurm, ...) are dlopened, so
# slurm-wlm-basic-plugins is added by name below.
RUN for lib in $(ldd /out/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u); do \
      dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib"; \
    done | cut -d: -f1 | sort -u > /out/runtime-packages \
 && cat /out/runtime-packages

FROM ${BASE}:${SUITE}-slim
ARG DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/runtime-packages /tmp/runtime-packages
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends ca-certificates $(cat /tmp/runtime-packages) \
      slurm-wlm-basic-plugins \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages \
 && groupadd -g 65532 duet && useradd -u 65532 -g duet -d /nonexistent -s /usr/sbin/nologin duet
COPY --from=build /out/bin/ /usr/local/bin/
# Non-root by default (duet-bridge). duet-node runs as root to write its
# socket into kubelet's directory (the chart sets runAsUser: 0 for it); with
# auth/slurm the chart runs duet-bridge as SlurmUser (values-slinky.yaml).
USER 65532:65532
ENTRYPOINT []
CMD ["duet-bridge", "--help"]
