# duetctl: the operator CLI. duet::ctl holds everything but main() so tests can
# drive the renderers, the client and the whole command line in-process.
duet_library(NAME duet_ctl ALIAS duet::ctl
  SRCS render.cc client.cc cli.cc
  DEPS duet::api duet::ledger duet::grpc_common duet::proto CLI11::CLI11 nlohmann_json::nlohmann_json
       absl::status absl::statusor absl::strings absl::synchronization absl::time)
target_compile_definitions(duet_ctl PRIVATE DUET_VERSION="${PROJECT_VERSION}")

add_executable(duetctl main.cc)
target_compile_options(duetctl PRIVATE ${DUET_WARNINGS})
target_link_libraries(duetctl PRIVATE duet::ctl)
