# spank_duet.so: the SPANK plugin (loaded by srun/sbatch/salloc, slurmd and
# slurmstepd). Built against the installed Slurm's headers; Slurm refuses a
# plugin whose plugin_version differs in major.minor (mask 0xffff00).
find_path(SLURM_SPANK_INCLUDE_DIR slurm/spank.h)
if(NOT SLURM_SPANK_INCLUDE_DIR)
  message(FATAL_ERROR "slurm/spank.h not found: install libslurm-dev")
endif()
file(STRINGS ${SLURM_SPANK_INCLUDE_DIR}/slurm/slurm_version.h _duet_slurm_ver
     REGEX "#define SLURM_VERSION_STRING")
message(STATUS "spank_duet: building for ${_duet_slurm_ver}")

# The logic, as a static library the unit tests link too. No libslurm here:
# in the plugin, Slurm's symbols come from the host process.
add_library(duet_spank_core STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/plugin_config.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/step_devices.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/bridge_client.cc)
add_library(duet::spank_core ALIAS duet_spank_core)
target_include_directories(duet_spank_core PUBLIC ${PROJECT_SOURCE_DIR})
target_include_directories(duet_spank_core SYSTEM PUBLIC ${SLURM_SPANK_INCLUDE_DIR})
target_compile_options(duet_spank_core PRIVATE ${DUET_WARNINGS} -fvisibility=hidden
                       -fvisibility-inlines-hidden)
target_link_libraries(duet_spank_core PUBLIC duet::slurm_format duet::proto gRPC::grpc++
                      absl::strings absl::status absl::statusor)

add_library(spank_duet MODULE
  ${CMAKE_CURRENT_SOURCE_DIR}/spank_duet.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/remote.cc)
set_target_properties(spank_duet PROPERTIES PREFIX "" OUTPUT_NAME spank_duet
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_compile_options(spank_duet PRIVATE ${DUET_WARNINGS})
target_link_libraries(spank_duet PRIVATE duet::spank_core)
target_link_options(spank_duet PRIVATE
  -Wl,--version-script=${CMAKE_CURRENT_SOURCE_DIR}/spank_duet.map -Wl,--as-needed)
set_property(TARGET spank_duet APPEND PROPERTY LINK_DEPENDS
             ${CMAKE_CURRENT_SOURCE_DIR}/spank_duet.map)
