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

# Watch-ingest benchmark (bench/CMakeLists.txt adds a fixed list of folders,
# so it is registered here). A tiny run is a ctest (labels bench + k8s); the
# full run: watch_ingest_bench --nodes 5000 --pods 50000.
if(DUET_BUILD_BENCH)
  add_executable(watch_ingest_bench ${PROJECT_SOURCE_DIR}/bench/k8s_watch/watch_ingest_bench.cc)
  target_compile_options(watch_ingest_bench PRIVATE ${DUET_WARNINGS})
  target_link_libraries(watch_ingest_bench PRIVATE duet::k8s)
  if(DUET_BUILD_TESTS)
    add_test(NAME k8s_watch_ingest_smoke
      COMMAND watch_ingest_bench --nodes 50 --pods 500 --node-events 200 --pod-events 2000)
    set_tests_properties(k8s_watch_ingest_smoke PROPERTIES LABELS "bench;k8s" TIMEOUT 60)
  endif()
endif()
