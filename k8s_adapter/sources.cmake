# k8s_adapter: everything that speaks Kubernetes. Included from
# k8s_adapter/CMakeLists.txt.
find_package(CURL REQUIRED)  # Debian: libcurl4-openssl-dev

duet_library(NAME duet_k8s ALIAS duet::k8s
  SRCS kube_config.cc kube_client.cc informer.cc node_inventory.cc kube_api.cc leader_election.cc
  DEPS duet::inventory duet::ledger CURL::libcurl nlohmann_json::nlohmann_json yaml-cpp
       spdlog::spdlog absl::status absl::statusor absl::strings absl::synchronization
       absl::random_random absl::flat_hash_map absl::time)

# The tests live in tests/k8s; tests/CMakeLists.txt only adds a fixed list
# of folders, so they are added from here (GoogleTest is found early for them).
if(DUET_BUILD_TESTS)
  find_package(GTest REQUIRED)
  enable_testing()
  include(GoogleTest)
  add_subdirectory(${PROJECT_SOURCE_DIR}/tests/k8s ${CMAKE_BINARY_DIR}/tests/k8s)
endif()
