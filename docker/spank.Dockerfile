# The SPANK add-on: spank_duet.so and its client module duet_spank_client.so,
# built for one Slurm release, with the client's shared libraries beside it
# (RUNPATH $ORIGIN), for an init container to copy into a slurmd pod
# (docker/README.md; examples/slinky-slurm-values.yaml):
#   docker build -f docker/spank.Dockerfile --build-arg SUITE=forky -t duet-spank:0.1.0-slurm26.05 .
# The suite picks the Slurm headers the plugin is built against (Slurm loads a
# plugin only for the release it was built for) and the C library it needs:
# build on a suite whose glibc is not newer than the slurmd image's.
# BASE and CMAKE_BUILD_PARALLEL_LEVEL: as in duet.Dockerfile.
# SLURM_TARBALL: for a Slurm release Debian does not package (25.11, the GKE
# Slurm add-on's), a Slurm source tarball inside the build context: Slurm is
# built from it in the build stage, in Debian's layout, and the plugin against
# it, instead of the suite's libslurm-dev. E.g. (scripts/images.sh slurm2511
# spank copies shared/slurm/src's tarball into docker/slurm-src/ first;
# bookworm: glibc 2.36, which Ubuntu 24.04's slurmd images (2.39) can load):
#   docker build -f docker/spank.Dockerfile --build-arg SUITE=bookworm \
#     --build-arg SLURM_TARBALL=docker/slurm-src/slurm-25.11.7.tar.xz -t duet-spank:0.1.0-slurm25.11 .
ARG SUITE=forky
ARG BASE=debian

FROM ${BASE}:${SUITE} AS build
ARG DEBIAN_FRONTEND=noninteractive
ARG SLURM_TARBALL=
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      cmake ninja-build g++ pkg-config patchelf ccache ca-certificates \
      libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev \
      nlohmann-json3-dev libsimdjson-dev zlib1g-dev libboost-dev libssl-dev \
      libmunge-dev libcurl4-openssl-dev \
      $(if [ -n "$SLURM_TARBALL" ]; then echo make xz-utils; \
        else echo libslurm-dev slurm-wlm-basic-plugins-dev; fi) \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG CMAKE_BUILD_PARALLEL_LEVEL
# Slurm from source (only with SLURM_TARBALL): configured as
# scripts/slurm-root.sh's slurm2511 root; only the headers and libslurm are
# used (the plugin takes Slurm's symbols from slurmstepd at run time).
RUN if [ -n "$SLURM_TARBALL" ]; then \
      mkdir /slurm-src && tar -C /slurm-src --strip-components=1 -xf "$SLURM_TARBALL" \
      && cd /slurm-src \
      && ./configure -q --prefix=/usr --sysconfdir=/etc/slurm \
           --libdir=/usr/lib/$(gcc -print-multiarch) \
           --localstatedir=/var --runstatedir=/run --with-munge=/usr >/dev/null \
      && make -s -j"${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >/dev/null \
      && make -s install >/dev/null && ldconfig \
      && cd / && rm -rf /slurm-src \
      && sed -n 's/^#define SLURM_VERSION_NUMBER //p' /usr/include/slurm/slurm_version.h; \
    fi
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
