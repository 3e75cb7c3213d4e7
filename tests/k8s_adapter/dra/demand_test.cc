// A pending pod's demand of the lending drivers: claims, templates (and the
// claim made of one), allocated claims, All, extended resources by
// extendedResourceName and by deviceclass.resource.kubernetes.io/<class>.

#include "k8s_adapter/dra/demand.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace k8s_dra {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

const std::vector<std::string> kDrivers = {"gpu.nvidia.com", "tpu.google.com"};

json Class(const std::string& name, const std::string& driver, const std::string& extended = "",
           const std::string& created = "2026-01-01T00:00:00Z") {
  json c = {{"apiVersion", "resource.k8s.io/v1"},
            {"kind", "DeviceClass"},
            {"metadata", {{"name", name}, {"creationTimestamp", created}}},
            {"spec",
             {{"selectors",
               {{{"cel", {{"expression", "device.driver == \"" + driver + "\""}}}}}}}}};
  if (!extended.empty()) c["spec"]["extendedResourceName"] = extended;
  return c;
}

json Request(const std::string& cls, json count = nullptr, const std::string& mode = "") {
  json ex = {{"deviceClassName", cls}};
  if (!count.is_null()) ex["count"] = count;
  if (!mode.empty()) ex["allocationMode"] = mode;
  return {{"name", "r"}, {"exactly", ex}};
}

json ClaimSpec(std::vector<json> requests) { return {{"devices", {{"requests", requests}}}}; }

json Pod(json claims = json::array(), json resources = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", "train"}, {"namespace", "ml"}}},
          {"spec",
           {{"resourceClaims", claims},
            {"containers", {{{"name", "main"}, {"resources", resources}}}}}},
          {"status",
           {{"conditions",
             {{{"type", "PodScheduled"}, {"status", "False"}, {"reason", "Unschedulable"}}}}}}};
}

DemandInputs Inputs() {
  DemandInputs in;
  in.device_classes = {Class("gpu.nvidia.com", "gpu.nvidia.com", "nvidia.com/gpu"),
                       Class("tpu.google.com", "tpu.google.com"),
                       Class("other", "example.com/fpga", "example.com/fpga")};
  return in;
}

TEST(DemandTest, ClaimsAndTemplatesByDriver) {
  DemandInputs in = Inputs();
  in.claims["ml/a"] = {{"spec", ClaimSpec({Request("gpu.nvidia.com", 2), Request("other", 5)})}};
  in.templates["ml/t"] = {{"spec", {{"spec", ClaimSpec({Request("gpu.nvidia.com")})}}}};
  in.claims["ml/tpu"] = {{"spec", ClaimSpec({Request("tpu.google.com", nullptr, "All")})}};
  json pod = Pod({{{"name", "a"}, {"resourceClaimName", "a"}},
                  {{"name", "t"}, {"resourceClaimTemplateName", "t"}},
                  {{"name", "tpu"}, {"resourceClaimName", "tpu"}}});
  ASSERT_TRUE(UnschedulablePod(pod));
  auto d = PodDemand(pod, in, kDrivers);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)["gpu.nvidia.com"].count, 3);
  EXPECT_FALSE((*d)["gpu.nvidia.com"].all);
  EXPECT_TRUE((*d)["tpu.google.com"].all);
}

TEST(DemandTest, TheClaimMadeOfATemplateAndAllocatedClaims) {
  DemandInputs in = Inputs();
  in.templates["ml/t"] = {{"spec", {{"spec", ClaimSpec({Request("gpu.nvidia.com", 4)})}}}};
  in.claims["ml/train-t-x"] = {{"spec", ClaimSpec({Request("gpu.nvidia.com", 1)})}};
  json pod = Pod({{{"name", "t"}, {"resourceClaimTemplateName", "t"}}});
  pod["status"]["resourceClaimStatuses"] = {{{"name", "t"}, {"resourceClaimName", "train-t-x"}}};
  EXPECT_EQ((*PodDemand(pod, in, kDrivers))["gpu.nvidia.com"].count, 1);
  in.claims["ml/train-t-x"]["status"] = {{"allocation", {{"devices", {{"results", json::array()}}}}}};
  EXPECT_TRUE(PodDemand(pod, in, kDrivers)->empty());
}

TEST(DemandTest, ExtendedResources) {
  DemandInputs in = Inputs();
  // A newer class for the same resource wins.
  in.device_classes.push_back(
      Class("gpu-new", "gpu.nvidia.com", "nvidia.com/gpu", "2026-06-01T00:00:00Z"));
  json pod = Pod(json::array(), {{"limits", {{"nvidia.com/gpu", "2"}, {"example.com/fpga", "1"}}},
                                 {"requests", {{"deviceclass.resource.kubernetes.io/tpu.google.com", "4"}}}});
  auto d = PodDemand(pod, in, kDrivers);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)["gpu.nvidia.com"].count, 2);
  EXPECT_EQ((*d)["tpu.google.com"].count, 4);
  EXPECT_EQ(d->count("example.com/fpga"), 0u);
  // Once the scheduler made the extended-resource claim, it is that claim's.
  pod["status"]["extendedResourceClaimStatus"] = {{"resourceClaimName", "train-extended-resources-x"}};
  EXPECT_TRUE(PodDemand(pod, in, kDrivers)->empty());
  json half = Pod(json::array(), {{"limits", {{"nvidia.com/gpu", "500m"}}}});
  EXPECT_THAT(std::string(PodDemand(half, in, kDrivers).status().message()),
              HasSubstr("not a whole number"));
  // A JSON integer (what kubectl sends for an unquoted 2) counts the same.
  json number = Pod(json::array(), {{"limits", {{"nvidia.com/gpu", 2}}}});
  auto n = PodDemand(number, in, kDrivers);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ((*n)["gpu.nvidia.com"].count, 2);
  json negative = Pod(json::array(), {{"limits", {{"nvidia.com/gpu", -1}}}});
  EXPECT_FALSE(PodDemand(negative, in, kDrivers).ok());
}

TEST(DemandTest, MissingObjectsAndBadShapes) {
  DemandInputs in = Inputs();
  EXPECT_EQ(PodDemand(Pod({{{"name", "a"}, {"resourceClaimName", "a"}}}), in, kDrivers).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(PodDemand(Pod({{{"name", "t"}, {"resourceClaimTemplateName", "t"}}}), in, kDrivers)
                .status().code(),
            absl::StatusCode::kNotFound);
  in.claims["ml/a"] = {{"spec", ClaimSpec({Request("gpu.nvidia.com", 0)})}};
  EXPECT_EQ(PodDemand(Pod({{{"name", "a"}, {"resourceClaimName", "a"}}}), in, kDrivers).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PodDemand(Pod({{{"name", "a"}}}), in, kDrivers).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DemandTest, OnlyUnschedulableUnboundPods) {
  json pod = Pod();
  EXPECT_TRUE(UnschedulablePod(pod));
  pod["status"]["conditions"][0]["reason"] = "SchedulerError";
  EXPECT_FALSE(UnschedulablePod(pod));
  pod = Pod();
  pod["spec"]["nodeName"] = "n";
  EXPECT_FALSE(UnschedulablePod(pod));
  EXPECT_FALSE(UnschedulablePod(json::object()));
}

}  // namespace
}  // namespace k8s_dra
}  // namespace duet
