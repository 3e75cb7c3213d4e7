# spank_duet.so: the SPANK plugin, loaded by srun/sbatch/salloc, slurmd and
# every slurmstepd. Plain C, linked against libc only (startup cost: see
# bench/slurm/RESULTS.md). duet_spank_client.so: the gRPC + munge bridge
# client it dlopens in slurmstepd for steps that need the bridge.
# Built against the installed Slurm's headers; Slurm refuses a plugin whose
# plugin_version differs in major.minor (mask 0xffff00).
find_path(SLURM_SPANK_INCLUDE_DIR slurm/spank.h)
if(NOT SLURM_SPANK_INCLUDE_DIR)
  message(FATAL_ERROR "slurm/spank.h not found: install libslurm-dev")
endif()
# The release it is for, from SLURM_VERSION_NUMBER (0xMMmmuu): slurm_version.h
# of 24.11 and later has no SLURM_VERSION_STRING.
file(STRINGS ${SLURM_SPANK_INCLUDE_DIR}/slurm/slurm_version.h _duet_slurm_ver
     REGEX "^#define SLURM_VERSION_NUMBER")
if(NOT _duet_slurm_ver MATCHES "0x([0-9a-fA-F][0-9a-fA-F])([0-9a-fA-F][0-9a-fA-F])([0-9a-fA-F][0-9a-fA-F])")
  message(FATAL_ERROR "no SLURM_VERSION_NUMBER in ${SLURM_SPANK_INCLUDE_DIR}/slurm/slurm_version.h")
endif()
math(EXPR DUET_SLURM_MAJOR "0x${CMAKE_MATCH_1}")
math(EXPR DUET_SLURM_MINOR "0x${CMAKE_MATCH_2}")
math(EXPR DUET_SLURM_MICRO "0x${CMAKE_MATCH_3}")
set(DUET_SLURM_RELEASE "${DUET_SLURM_MAJOR}.${DUET_SLURM_MINOR}")
if(DUET_SLURM_MINOR LESS 10)
  set(DUET_SLURM_RELEASE "${DUET_SLURM_MAJOR}.0${DUET_SLURM_MINOR}")
endif()
message(STATUS "spank_duet: building for Slurm ${DUET_SLURM_RELEASE} "
               "(${DUET_SLURM_RELEASE}.${DUET_SLURM_MICRO} headers in ${SLURM_SPANK_INCLUDE_DIR}); "
               "slurmd and slurmstepd load it only if they are ${DUET_SLURM_RELEASE}.x")
find_package(OpenSSL REQUIRED)
find_path(MUNGE_INCLUDE_DIR munge.h)
find_library(MUNGE_LIBRARY munge)
if(NOT MUNGE_INCLUDE_DIR OR NOT MUNGE_LIBRARY)
  message(FATAL_ERROR "libmunge not found: install libmunge-dev")
endif()

# The client logic, as a static library the unit tests link too. No libslurm
# here: in the module, Slurm's symbols come from slurmstepd.
add_library(duet_spank_core STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/plugin_args.c
  ${CMAKE_CURRENT_SOURCE_DIR}/plugin_config.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/step_devices.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/tpu_slice_env.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/bridge_client.cc)
add_library(duet::spank_core ALIAS duet_spank_core)
set_target_properties(duet_spank_core PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(duet_spank_core PUBLIC ${PROJECT_SOURCE_DIR})
target_include_directories(duet_spank_core SYSTEM PUBLIC ${SLURM_SPANK_INCLUDE_DIR}
                           ${MUNGE_INCLUDE_DIR})
target_compile_options(duet_spank_core PRIVATE ${DUET_WARNINGS} -fvisibility=hidden
                       $<$<COMPILE_LANGUAGE:CXX>:-fvisibility-inlines-hidden>)
target_link_libraries(duet_spank_core PUBLIC duet::common duet::slurm_format duet::credential duet::device
                      duet::proto gRPC::grpc++
                      absl::strings absl::status absl::statusor ${MUNGE_LIBRARY})

# The plugin: C only, no C++ runtime, nothing but libc (and libdl's dlopen).
add_library(spank_duet MODULE
  ${CMAKE_CURRENT_SOURCE_DIR}/spank_duet.c
  ${CMAKE_CURRENT_SOURCE_DIR}/plugin_args.c
  ${CMAKE_CURRENT_SOURCE_DIR}/agent_path.c
  ${PROJECT_SOURCE_DIR}/common/step_agent/step_wire.c
  ${PROJECT_SOURCE_DIR}/common/step_agent/step_cred.c)
set_target_properties(spank_duet PROPERTIES PREFIX "" OUTPUT_NAME spank_duet
  LINKER_LANGUAGE C)  # exports: spank_duet.map
target_include_directories(spank_duet PRIVATE ${PROJECT_SOURCE_DIR})
# munge.h for libmunge's types only: agent_path.c dlopens libmunge.so.2.
target_include_directories(spank_duet SYSTEM PRIVATE ${SLURM_SPANK_INCLUDE_DIR} ${MUNGE_INCLUDE_DIR})
target_compile_options(spank_duet PRIVATE ${DUET_WARNINGS})
target_link_libraries(spank_duet PRIVATE ${CMAKE_DL_LIBS})
target_link_options(spank_duet PRIVATE
  -Wl,--version-script=${CMAKE_CURRENT_SOURCE_DIR}/spank_duet.map -Wl,--as-needed)
set_property(TARGET spank_duet APPEND PROPERTY LINK_DEPENDS
             ${CMAKE_CURRENT_SOURCE_DIR}/spank_duet.map)

# The bridge client module, next to the plugin (its default location). It is
# built from source rather than from duet_spank_core/duet::proto because those
# link gRPC::grpc++, and the module links gRPC::grpc++_unsecure instead: the
# client speaks plain gRPC (unix socket or TCP) only, and leaving out
# libssl/libcrypto and gRPC's TLS code halves the module's dlopen time in
# slurmstepd (68 -> 37 ms p50, bench/slurm/RESULTS.md).
set(_duet_gen ${PROJECT_BINARY_DIR}/proto/gen)
set(_duet_client_gen ${_duet_gen}/duet/v1/duet.pb.cc ${_duet_gen}/duet/v1/duet.grpc.pb.cc
    ${_duet_gen}/google/rpc/status.pb.cc ${_duet_gen}/google/rpc/error_details.pb.cc)
set_source_files_properties(${_duet_client_gen} PROPERTIES GENERATED TRUE)
add_library(duet_spank_client MODULE
  ${CMAKE_CURRENT_SOURCE_DIR}/client_module.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/remote.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/plugin_args.c
  ${CMAKE_CURRENT_SOURCE_DIR}/plugin_config.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/step_devices.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/tpu_slice_env.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/tpu_slice_slurm.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/bridge_client.cc
  ${PROJECT_SOURCE_DIR}/common/slurm/slurm_format.cc
  ${PROJECT_SOURCE_DIR}/common/credential/slurm_key_cred.cc
  ${PROJECT_SOURCE_DIR}/common/device/device.cc
  ${_duet_client_gen})
add_dependencies(duet_spank_client duet_proto)  # runs protoc first
set_target_properties(duet_spank_client PROPERTIES PREFIX "" OUTPUT_NAME duet_spank_client
  CXX_VISIBILITY_PRESET hidden C_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_include_directories(duet_spank_client PRIVATE ${PROJECT_SOURCE_DIR} ${_duet_gen})
target_include_directories(duet_spank_client SYSTEM PRIVATE ${SLURM_SPANK_INCLUDE_DIR}
                           ${MUNGE_INCLUDE_DIR})
target_compile_options(duet_spank_client PRIVATE
  $<$<NOT:$<IN_LIST:$<TARGET_PROPERTY:SOURCE>,${_duet_client_gen}>>:${DUET_WARNINGS}>)
target_link_libraries(duet_spank_client PRIVATE gRPC::grpc++_unsecure protobuf::libprotobuf
                      absl::strings absl::str_format absl::status absl::statusor absl::time
                      OpenSSL::Crypto ${MUNGE_LIBRARY})
target_link_options(duet_spank_client PRIVATE
  -Wl,--version-script=${CMAKE_CURRENT_SOURCE_DIR}/duet_spank_client.map -Wl,--as-needed)
set_property(TARGET duet_spank_client APPEND PROPERTY LINK_DEPENDS
             ${CMAKE_CURRENT_SOURCE_DIR}/duet_spank_client.map)
# Building the plugin builds its client module.
add_dependencies(spank_duet duet_spank_client)
