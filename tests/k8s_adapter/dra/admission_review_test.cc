// AdmissionReview parsing (resourceclaims/status, v1 and v1beta2 claims) and
// the answer's shape.

#include "k8s_adapter/dra/admission_review.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/k8s_adapter/dra/review_fixture.h"

namespace duet {
namespace k8s_dra {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::Allocation;
using testing::Review;

TEST(AdmissionReviewTest, ParsesAnAllocation) {
  for (const char* version : {"v1", "v1beta2"}) {
    absl::StatusOr<ParsedReview> r = ParseAdmissionReview(Review(version));
    ASSERT_TRUE(r.ok()) << version << ": " << r.status();
    EXPECT_EQ(r->uid, "review-uid-7");
    EXPECT_EQ(r->api_version, "admission.k8s.io/v1");
    EXPECT_EQ(r->ask.claim.uid, "claim-uid-1");
    EXPECT_EQ(r->ask.claim.ns, "ml");
    EXPECT_EQ(r->ask.claim.name, "train-gpu");
    EXPECT_EQ(r->ask.node, "gpu-node-1");
    EXPECT_TRUE(r->ask.old_results.empty());
    ASSERT_EQ(r->ask.new_results.size(), 1u);
    EXPECT_EQ(r->ask.new_results[0].device,
              (dra::DraDevice{"gpu.nvidia.com", "gpu-node-1", "gpu-3"}));
    EXPECT_EQ(r->ask.new_results[0].request, "gpu");
    EXPECT_FALSE(r->ask.new_results[0].admin_access);
    EXPECT_FALSE(r->ask.dry_run);
  }
}

TEST(AdmissionReviewTest, ThePodsTheClaimIsFor) {
  json review = Review();
  json& claim = review["request"]["object"];
  // The scheduler's reservedFor (written with the allocation) and the pod
  // owning a claim made from a template; other consumers and owners are not
  // pods, and a pod named twice counts once.
  claim["status"]["reservedFor"] = {
      {{"resource", "pods"}, {"name", "w-0"}, {"uid", "pod-uid-0"}},
      {{"apiGroup", "example.com"}, {"resource", "pods"}, {"name", "x"}, {"uid", "not-a-pod"}},
      {{"resource", "jobs"}, {"name", "j"}, {"uid", "job-uid"}}};
  claim["metadata"]["ownerReferences"] = {
      {{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", "w-0"}, {"uid", "pod-uid-0"}},
      {{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", "w-1"}, {"uid", "pod-uid-1"}},
      {{"apiVersion", "batch/v1"}, {"kind", "Job"}, {"name", "j"}, {"uid", "job-uid"}}};
  absl::StatusOr<ParsedReview> r = ParseAdmissionReview(review);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ask.pods, (std::vector<std::string>{"pod-uid-0", "pod-uid-1"}));
  // None named: none.
  r = ParseAdmissionReview(Review());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->ask.pods.empty());
  // The wrong shape is refused, naming the field.
  claim["status"]["reservedFor"] = "pod-uid-0";
  r = ParseAdmissionReview(review);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("request.object.status.reservedFor"));
  claim["status"].erase("reservedFor");
  claim["metadata"]["ownerReferences"] = {{{"kind", "Pod"}, {"apiVersion", "v1"}, {"uid", 7}}};
  r = ParseAdmissionReview(review);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("ownerReferences[].uid"));
}

TEST(AdmissionReviewTest, OldResultsAdminAccessAndDryRun) {
  json review = Review("v1", Allocation("gpu-node-1", "gpu-3", /*admin=*/true), /*dry_run=*/true);
  review["request"]["oldObject"]["status"]["allocation"] = Allocation("gpu-node-1", "gpu-3", true);
  absl::StatusOr<ParsedReview> r = ParseAdmissionReview(review);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ask.dry_run);
  ASSERT_EQ(r->ask.old_results.size(), 1u);
  EXPECT_TRUE(r->ask.old_results[0].admin_access);
  EXPECT_TRUE(r->ask.new_results[0].admin_access);
}

TEST(AdmissionReviewTest, DeallocationHasNoNewResults) {
  json review = Review("v1", nullptr);
  review["request"]["oldObject"]["status"]["allocation"] = Allocation("gpu-node-1", "gpu-3");
  absl::StatusOr<ParsedReview> r = ParseAdmissionReview(review);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ask.new_results.empty());
  EXPECT_EQ(r->ask.node, "");
  EXPECT_EQ(r->ask.old_results.size(), 1u);
}

TEST(AdmissionReviewTest, TheNodeOnlyWhenTheSelectorNamesOne) {
  json review = Review();
  review["request"]["object"]["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
        ["matchFields"][0]["values"] = {"a", "b"};
  absl::StatusOr<ParsedReview> r = ParseAdmissionReview(review);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ask.node, "");
  review["request"]["object"]["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
        ["matchFields"][0]["operator"] = "NotIn";
  review["request"]["object"]["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
        ["matchFields"][0]["values"] = {"a"};
  EXPECT_EQ(ParseAdmissionReview(review)->ask.node, "");
}

// Each mutation of a good review -> the field the error must name.
TEST(AdmissionReviewTest, RefusesWhatIsNotAClaimStatusReview) {
  struct Case {
    const char* pointer;
    json value;
    const char* names;
  } cases[] = {
      {"/apiVersion", "admission.k8s.io/v1beta1", "apiVersion"},
      {"/kind", "Pod", "kind AdmissionReview"},
      {"/request/uid", "", "request.uid"},
      {"/request/resource/resource", "pods", "request.resource"},
      {"/request/resource/group", "", "request.resource"},
      {"/request/resource/version", "v2", "request.resource"},
      {"/request/subResource", "", "request.subResource"},
      {"/request/operation", "CREATE", "request.operation"},
      {"/request/object/kind", "Pod", "request.object: must be a ResourceClaim"},
      {"/request/object/metadata/uid", nullptr, "request.object.metadata.uid"},
      {"/request/object/status/allocation/devices/results/0/device", "",
       "request.object.status.allocation.devices.results[0].device"},
      {"/request/object/status/allocation/devices/results/0/pool", 7,
       "results[0].pool: must be a string"},
      {"/request/object/status/allocation/devices/results/0/adminAccess", "yes",
       "adminAccess: must be a boolean"},
      {"/request/object/status/allocation/devices/results", json::object(), "must be a list"},
      {"/request/oldObject/kind", "Node", "request.oldObject"},
      {"/request/dryRun", "true", "request.dryRun"},
  };
  for (const Case& c : cases) {
    json review = Review();
    review[json::json_pointer(c.pointer)] = c.value;
    absl::StatusOr<ParsedReview> r = ParseAdmissionReview(review);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.pointer;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.names)) << c.pointer;
  }
  EXPECT_FALSE(ParseAdmissionReview(json::array()).ok());
  json no_request = Review();
  no_request.erase("request");
  EXPECT_THAT(std::string(ParseAdmissionReview(no_request).status().message()),
              HasSubstr("request: required"));
}

TEST(AdmissionReviewTest, BodiesThatAreNotJsonOrTooDeep) {
  EXPECT_THAT(std::string(ParseAdmissionReviewBody("{\"a\": ").status().message()),
              HasSubstr("not JSON"));
  EXPECT_THAT(std::string(ParseAdmissionReviewBody(std::string(100000, '[')).status().message()),
              HasSubstr("deeper than 64"));
  EXPECT_TRUE(ParseAdmissionReviewBody(Review().dump()).ok());
}

TEST(AdmissionReviewTest, TheAnswer) {
  json allowed = AdmissionResponse("admission.k8s.io/v1", "u-1", {true, "", ""});
  EXPECT_EQ(allowed, (json{{"apiVersion", "admission.k8s.io/v1"},
                           {"kind", "AdmissionReview"},
                           {"response", {{"uid", "u-1"}, {"allowed", true}}}}));
  json denied = AdmissionResponse("admission.k8s.io/v1", "u-2",
                                  {false, "NOT_LENT", "gpu.nvidia.com/n/gpu-0 is not lent"});
  EXPECT_EQ(denied["response"], (json{{"uid", "u-2"},
                                      {"allowed", false},
                                      {"status",
                                       {{"code", 403},
                                        {"reason", "NOT_LENT"},
                                        {"message", "gpu.nvidia.com/n/gpu-0 is not lent"}}}}));
}

}  // namespace
}  // namespace k8s_dra
}  // namespace duet
