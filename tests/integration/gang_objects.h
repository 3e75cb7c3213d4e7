// Kubernetes objects the gang e2e tests post to the fake API server.
#ifndef DUET_TESTS_INTEGRATION_GANG_OBJECTS_H_
#define DUET_TESTS_INTEGRATION_GANG_OBJECTS_H_

#include <string>

#include "nlohmann/json.hpp"

namespace duet::testing {

// A scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1) of
// `min_member` pods in namespace default.
inline nlohmann::json PodGroup(const std::string& name, int min_member) {
  return {{"apiVersion", "scheduling.x-k8s.io/v1alpha1"},
          {"kind", "PodGroup"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec", {{"minMember", min_member}}}};
}

}  // namespace duet::testing

#endif  // DUET_TESTS_INTEGRATION_GANG_OBJECTS_H_
