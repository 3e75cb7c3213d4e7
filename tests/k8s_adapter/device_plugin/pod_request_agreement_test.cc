// Regression: the scheduler extender and duet-node read the same pod the same
// way. They used to differ: the extender took requests before limits and
// counted sidecars, duet-node took limits first, ignored sidecars and read a
// bad quantity as 0 -- so a pod with a limits-only sidecar asking a GPU was
// placed on 3 devices and then looked for as a pod wanting 2.

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/device_plugin/allocation.h"
#include "k8s_adapter/extender/types.h"

namespace duet {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// A pending pod bound to node "n": an app container with GPU limits only, a
// sidecar (restartPolicy Always) with GPU limits only, and an init container
// whose CPU peak exceeds the app's.
json SidecarPod() {
  return json::parse(R"({
    "metadata": {"uid": "u1", "namespace": "ml", "name": "train"},
    "spec": {
      "nodeName": "n",
      "initContainers": [
        {"name": "proxy", "restartPolicy": "Always",
         "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "500m", "memory": "256Mi"}}},
        {"name": "fetch", "resources": {"requests": {"cpu": "6"}}}
      ],
      "containers": [
        {"name": "main",
         "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4", "memory": "2Gi"},
                       "requests": {"cpu": "3"}}}
      ],
      "overhead": {"memory": "64Mi"}
    },
    "status": {"phase": "Pending"}
  })");
}

TEST(PodRequestAgreementTest, ExtenderAndDevicePluginAgreeOnSidecarsAndLimitsOnly) {
  const json pod = SidecarPod();
  absl::StatusOr<placement::PodRequest> placed = extender::ParsePodRequest(pod);
  ASSERT_TRUE(placed.ok()) << placed.status();
  absl::StatusOr<std::vector<node::PendingPod>> pending =
      node::PendingPodsFromList(json{{"items", json::array({pod})}}, "n");
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_EQ(pending->size(), 1u);
  const node::PendingPod& seen = (*pending)[0];

  EXPECT_EQ(placed->count, 3u);  // app 2 + sidecar 1
  EXPECT_EQ(seen.gpus, placed->count);
  EXPECT_EQ(placed->cpu_milli, 6500u);  // max(app 3 + sidecar 0.5, init 6 + sidecar 0.5)
  EXPECT_EQ(seen.cpus, 7u);             // the same, in whole CPUs rounded up
  EXPECT_EQ(placed->memory_mib, 2048u + 256 + 64);
  EXPECT_EQ(seen.memory_mib, placed->memory_mib);
}

TEST(PodRequestAgreementTest, BothRefuseABadQuantity) {
  json pod = SidecarPod();
  pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "two";
  absl::StatusOr<placement::PodRequest> placed = extender::ParsePodRequest(pod);
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<node::PendingPod>> pending =
      node::PendingPodsFromList(json{{"items", json::array({pod})}}, "n");
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(pending.status().message()),
              HasSubstr("pod ml/train: spec.containers[0].resources.limits[nvidia.com/gpu]"));
}

}  // namespace
}  // namespace duet
