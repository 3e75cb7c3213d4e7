# k8s_adapter: everything that speaks Kubernetes. Included from
# k8s_adapter/CMakeLists.txt.
find_package(CURL REQUIRED)  # Debian: libcurl4-openssl-dev

duet_library(NAME duet_k8s ALIAS duet::k8s
  SRCS kube_config.cc kube_client.cc informer.cc node_inventory.cc kube_api.cc leader_election.cc
       pod_watch.cc event_recorder.cc token_review.cc
  DEPS duet::k8s_common duet::inventory duet::ledger CURL::libcurl nlohmann_json::nlohmann_json yaml-cpp
       spdlog::spdlog absl::status absl::statusor absl::strings absl::synchronization
       absl::random_random absl::flat_hash_map absl::time)
