// A pod's effective request, Kubernetes' rules, one table: requests before
// limits, init containers, sidecars (restartPolicy Always), overhead, the
// extended-resource rule, and bad input named by its field.

#include "k8s_adapter/common/pod_request.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace k8s {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

json C(const json& requests, const json& limits = nullptr) {
  json c = {{"name", "c"}, {"resources", json::object()}};
  if (!requests.is_null()) c["resources"]["requests"] = requests;
  if (!limits.is_null()) c["resources"]["limits"] = limits;
  return c;
}
json Sidecar(const json& requests, const json& limits = nullptr) {
  json c = C(requests, limits);
  c["restartPolicy"] = "Always";
  return c;
}
// (A vector: a one-element brace list would be the element itself in json.)
json Pod(const std::vector<json>& containers, const json& inits = nullptr,
         const json& overhead = nullptr) {
  json pod = {{"metadata", {{"name", "p"}}}, {"spec", {{"containers", json(containers)}}}};
  if (!inits.is_null()) pod["spec"]["initContainers"] = inits;
  if (!overhead.is_null()) pod["spec"]["overhead"] = overhead;
  return pod;
}

struct Case {
  const char* name;
  json pod;
  ResourceList want;
};

TEST(EffectivePodRequestTest, KubernetesRules) {
  const std::vector<Case> kCases = {
      {"no resources", Pod({C(nullptr)}), {}},
      {"app containers add up",
       Pod({C({{"cpu", "500m"}, {"memory", "1Gi"}}), C({{"cpu", "2"}})}),
       {{"cpu", 2500}, {"memory", (int64_t{1} << 30) * 1000}}},
      {"a limit stands in for an absent request",
       Pod({C({{"cpu", "1"}}, {{"cpu", "2"}, {"memory", "1G"}, {"nvidia.com/gpu", "2"}})}),
       {{"cpu", 1000}, {"memory", int64_t{1000000000} * 1000}, {"nvidia.com/gpu", 2000}}},
      {"extended resource with equal request and limit",
       Pod({C({{"nvidia.com/gpu", "1"}}, {{"nvidia.com/gpu", "1"}})}),
       {{"nvidia.com/gpu", 1000}}},
      {"an init container larger than the app containers",
       Pod({C({{"cpu", "1"}})}, json::array({C({{"cpu", "4"}, {"google.com/tpu", "4"}})})),
       {{"cpu", 4000}, {"google.com/tpu", 4000}}},
      {"init containers run one at a time: their max, not their sum",
       Pod({C({{"cpu", "1"}})}, json::array({C({{"cpu", "3"}}), C({{"cpu", "2"}})})),
       {{"cpu", 3000}}},
      {"a sidecar runs beside the app containers",
       Pod({C({{"cpu", "1"}})}, json::array({Sidecar({{"cpu", "500m"}})})),
       {{"cpu", 1500}}},
      {"a sidecar runs beside the init containers after it",
       Pod({C({{"cpu", "1"}, {"nvidia.com/gpu", "1"}})},
           json::array({Sidecar({{"cpu", "500m"}}), C({{"cpu", "4"}, {"nvidia.com/gpu", "1"}})})),
       {{"cpu", 4500}, {"nvidia.com/gpu", 1000}}},
      {"but not beside the init containers before it",
       Pod({C({{"cpu", "1"}})}, json::array({C({{"cpu", "4"}}), Sidecar({{"cpu", "500m"}})})),
       {{"cpu", 4000}}},
      {"a limits-only sidecar with a GPU",
       Pod({C(nullptr, {{"nvidia.com/gpu", "2"}})},
           json::array({Sidecar(nullptr, {{"nvidia.com/gpu", "1"}})})),
       {{"nvidia.com/gpu", 3000}}},
      {"overhead is added",
       Pod({C({{"cpu", "1"}})}, nullptr, {{"cpu", "100m"}, {"memory", "10Mi"}}),
       {{"cpu", 1100}, {"memory", (int64_t{10} << 20) * 1000}}},
      {"numbers are quantities too",
       Pod({C({{"cpu", 2}, {"memory", 1.5}})}),
       {{"cpu", 2000}, {"memory", 1500}}},
      {"null lists are empty", Pod({C(nullptr, nullptr)}, nullptr, nullptr), {}},
  };
  for (const Case& c : kCases) {
    absl::StatusOr<ResourceList> got = EffectivePodRequest(c.pod);
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    EXPECT_EQ(*got, c.want) << c.name;  // milli-units; memory in milli-bytes
  }
}

TEST(EffectivePodRequestTest, BadInputNamesTheField) {
  const struct {
    const char* name;
    json pod;
    const char* want;
  } kCases[] = {
      {"not an object", json::array(), "pod: not an object"},
      {"no spec", json{{"metadata", json::object()}}, "spec: missing"},
      {"no containers", json{{"spec", json::object()}}, "spec.containers: missing or not a list"},
      {"containers not a list", json{{"spec", {{"containers", "x"}}}},
       "spec.containers: missing or not a list"},
      {"container not an object", Pod({"x"}), "spec.containers[0]: not an object"},
      {"resources not an object", Pod({json{{"resources", 3}}}),
       "spec.containers[0].resources: not an object"},
      {"requests not an object", Pod({json{{"resources", {{"requests", "1"}}}}}),
       "spec.containers[0].resources.requests: not an object"},
      {"bad quantity", Pod({C(nullptr), C({{"nvidia.com/gpu", "x"}})}),
       "spec.containers[1].resources.requests[nvidia.com/gpu]: \"x\": not a quantity"},
      {"quantity of the wrong type", Pod({C(nullptr, {{"cpu", true}})}),
       "spec.containers[0].resources.limits[cpu]: not a quantity"},
      {"negative", Pod({C({{"memory", "-1Gi"}})}),
       "spec.containers[0].resources.requests[memory]: \"-1Gi\": negative"},
      {"extended resource overcommitted",
       Pod({C({{"nvidia.com/gpu", "1"}}, {{"nvidia.com/gpu", "2"}})}),
       "spec.containers[0].resources: nvidia.com/gpu: request (1000m) and limit (2000m) differ"},
      {"init containers not a list", Pod({C(nullptr)}, json{{"a", 1}}),
       "spec.initContainers: not a list"},
      {"bad init quantity", Pod({C(nullptr)}, json::array({C({{"cpu", "1x"}})})),
       "spec.initContainers[0].resources.requests[cpu]: \"1x\": unknown suffix"},
      {"restartPolicy not a string", Pod({C(nullptr)}, json::array({json{{"restartPolicy", 1}}})),
       "spec.initContainers[0].restartPolicy: not a string"},
      {"bad overhead", Pod({C(nullptr)}, nullptr, {{"cpu", "lots"}}),
       "spec.overhead[cpu]: \"lots\""},
      {"sum out of range",
       Pod({C({{"cpu", "9000000000000000"}}), C({{"cpu", "9000000000000000"}})}),
       "spec.containers[1]: cpu: sum out of range"},
  };
  for (const auto& c : kCases) {
    absl::StatusOr<ResourceList> got = EffectivePodRequest(c.pod);
    ASSERT_FALSE(got.ok()) << c.name;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.want)) << c.name;
  }
}

TEST(EffectivePodRequestTest, ExtendedResourcesAreDomainPrefixedOutsideKubernetesIo) {
  EXPECT_TRUE(IsExtendedResource("nvidia.com/gpu"));
  EXPECT_TRUE(IsExtendedResource("google.com/tpu"));
  EXPECT_FALSE(IsExtendedResource("cpu"));
  EXPECT_FALSE(IsExtendedResource("hugepages-2Mi"));
  EXPECT_FALSE(IsExtendedResource("kubernetes.io/foo"));
  EXPECT_FALSE(IsExtendedResource("example.kubernetes.io/foo"));
  // A native resource may be overcommitted: request below limit is fine.
  absl::StatusOr<ResourceList> r = EffectivePodRequest(Pod({C({{"cpu", "1"}}, {{"cpu", "2"}})}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Amount(*r, "cpu"), 1000);
  EXPECT_EQ(Amount(*r, "memory"), 0);
}

TEST(StringFieldTest, AbsentIsEmptyWrongTypeIsAnError) {
  const json obj = {{"a", "x"}, {"b", nullptr}, {"c", 3}};
  EXPECT_EQ(*StringField(obj, "a", "o"), "x");
  EXPECT_EQ(*StringField(obj, "b", "o"), "");
  EXPECT_EQ(*StringField(obj, "z", "o"), "");
  EXPECT_THAT(std::string(StringField(obj, "c", "o").status().message()),
              HasSubstr("o.c: not a string"));
  EXPECT_EQ(Field(json::array(), "a"), nullptr);
}

}  // namespace
}  // namespace k8s
}  // namespace duet
