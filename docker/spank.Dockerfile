# The SPANK add-on: spank_duet.so and its client module duet_spank_client.so,
# built for one Slurm release, with the client's shared libraries beside it
# (RUNPATH $ORIGIN), for an init container to copy into a slurmd pod
# (docker/README.md; examples/slinky-slurm-values.yaml):
#   docker build -f docker/spank.Dockerfile --build-arg SUITE=forky -t duet-spank:0.1.0-slurm26.05 .
# The suite picks the Slurm headers the plugin is built against (Slurm loads a
# plugin only for the release it was built for) and the C library it needs:
# build on a suite whose glibc is not newer than the slurmd image's.
# BASE and CMAKE_BUILD_PARALLEL_LEVEL: as in duet.Dockerfile.
ARG SUITE=forky
ARG BASE=debian

FROM ${BASE}:${SUITE} AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      cmake ninja-build g++ pkg-config patchelf ccache ca-certificates \
      libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev \
      nlohmann-json3-dev libsimdjson-dev zlib1g-dev libboost-dev libssl-dev \
      libslurm-dev slurm-wlm-basic-plugins-dev libmunge-dev libcurl4-openssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG CMAKE_BUILD_PARALLEL_LEVEL
RUN --mount=type=cache,target=/var/cache/ccache \
    export CCACHE_DIR=/var/cache/ccache CCACHE_BASEDIR=/src \
 && ccache --zero-stats >/dev/null \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache \
 && cmake --build /build --target spank_duet duet_spank_client \
 && ccache --show-stats \
 && mkdir -p /out/lib \
 && cp /build/slurm_plugin/spank_duet.so /build/slurm_plugin/duet_spank_client.so /out/lib/
# The client module's libraries (gRPC, protobuf, abseil, munge, ...) go next
# to it, except the C library and loader, which come from the slurmd image.
RUN ldd /out/lib/duet_spank_client.so | awk '$3 ~ /^\// {print $3}' \
      | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' \
      | xargs -r -I{} cp -L {} /out/lib/ \
 && for f in /out/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$f"; done \
 && strip --strip-debug /out/lib/*

FROM ${BASE}:${SUITE}-slim
COPY --from=build /out/lib/ /opt/duet/lib/
USER 65532:65532
# An init container copies /opt/duet/lib/* where plugstack.conf points.
CMD ["ls", "-l", "/opt/duet/lib"]
