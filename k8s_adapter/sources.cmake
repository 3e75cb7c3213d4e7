# k8s_adapter: everything that speaks Kubernetes. Included from
# k8s_adapter/CMakeLists.txt.
find_package(CURL REQUIRED)  # Debian: libcurl4-openssl-dev

# duet::kube: the generic Kubernetes client (in-cluster config, the curl
# client, informers, typed calls, leader election, Events). Nothing of the
# ledger and no YAML: duet-node links it. Kubeconfig files are
# duet::kube_config's (kubeconfig/).
duet_library(NAME duet_kube ALIAS duet::kube
  SRCS kube_config.cc kube_client.cc informer.cc kube_api.cc leader_election.cc event_recorder.cc
       token_review.cc
  DEPS duet::common CURL::libcurl nlohmann_json::nlohmann_json spdlog::spdlog absl::status
       absl::statusor absl::strings absl::synchronization absl::random_random absl::flat_hash_map
       absl::time)
