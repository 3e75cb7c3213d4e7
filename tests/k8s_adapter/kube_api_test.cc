#include "k8s_adapter/kube_api.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using testing::FakeApiServer;

nlohmann::json Pod(const std::string& name) {
  return {{"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "ml"}, {"annotations", {{"keep", "1"}, {"drop", "x"}}}}},
          {"spec", {{"schedulerName", "duet"}, {"containers", {{{"name", "c"}, {"image", "i"}}}}}}};
}

TEST(KubeApiTest, BindPatchAndEvent) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  nlohmann::json pod = fake.Put(Pod("trainer-0"));
  const std::string uid = pod["metadata"]["uid"];
  KubeConfig c;
  c.server = fake.url();
  auto client = *NewCurlKubeClient(c);

  EXPECT_EQ(BindPod(*client, "ml", "trainer-0", "not-the-uid", "gpu-1").code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(BindPod(*client, "ml", "trainer-0", uid, "gpu-1").ok());
  EXPECT_EQ(BindPod(*client, "ml", "trainer-0", uid, "gpu-2").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(BindPod(*client, "ml", "gone", "", "gpu-1").code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(PatchPodAnnotations(*client, "ml", "trainer-0",
                                  {{"duet.dev/devices", "gpu:0,1"}, {"drop", std::nullopt}})
                  .ok());
  nlohmann::json got = nlohmann::json::parse(*client->Get("/api/v1/namespaces/ml/pods/trainer-0"));
  EXPECT_EQ(got["spec"]["nodeName"], "gpu-1");
  EXPECT_EQ(got["metadata"]["annotations"],
            (nlohmann::json{{"keep", "1"}, {"duet.dev/devices", "gpu:0,1"}}));

  EventSpec e;
  e.object_kind = "Pod";
  e.object_namespace = "ml";
  e.object_name = "trainer-0";
  e.object_uid = uid;
  e.reason = "DuetRefused";
  e.message = "no free GPU on gpu-1: held by slurm job 12";
  ASSERT_TRUE(PostEvent(*client, e, absl::FromUnixSeconds(1764680000)).ok());
  EventSpec node_event = e;
  node_event.object_kind = "Node";
  node_event.object_namespace = "";
  node_event.object_name = "gpu-1";
  ASSERT_TRUE(PostEvent(*client, node_event, absl::Now()).ok());
  nlohmann::json events = nlohmann::json::parse(*client->Get("/api/v1/namespaces/ml/events"));
  ASSERT_EQ(events["items"].size(), 1u);
  const nlohmann::json& ev = events["items"][0];
  EXPECT_EQ(ev["involvedObject"]["uid"], uid);
  EXPECT_EQ(ev["reason"], "DuetRefused");
  EXPECT_EQ(ev["type"], "Warning");
  EXPECT_EQ(ev["source"]["component"], "duet-bridge");
  EXPECT_EQ(ev["firstTimestamp"], "2025-12-02T12:53:20Z");
  EXPECT_EQ(ev["metadata"]["name"].get<std::string>().rfind("trainer-0.", 0), 0u);
  nlohmann::json def = nlohmann::json::parse(*client->Get("/api/v1/namespaces/default/events"));
  ASSERT_EQ(def["items"].size(), 1u);
  EXPECT_FALSE(def["items"][0]["involvedObject"].contains("namespace"));
  EXPECT_EQ(FormatMicroTime(absl::FromUnixMicros(1764680000123456)), "2025-12-02T12:53:20.123456Z");
}

// A pod a PodDisruptionBudget protects: Running and Ready (the Eviction API
// deletes Pending pods without asking the budget).
nlohmann::json ReadyPod(const std::string& name) {
  nlohmann::json pod = Pod(name);
  pod["metadata"]["labels"] = {{"app", "a"}};
  pod["status"] = {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}};
  return pod;
}

TEST(KubeApiTest, EvictPodRespectsDisruptionBudgets) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  const std::string uid0 = fake.Put(ReadyPod("trainer-0"))["metadata"]["uid"];
  const std::string uid1 = fake.Put(ReadyPod("trainer-1"))["metadata"]["uid"];
  nlohmann::json other = ReadyPod("infer-0");
  other["metadata"]["labels"] = {{"app", "b"}};
  fake.Put(other);
  KubeConfig c;
  c.server = fake.url();
  auto client = *NewCurlKubeClient(c);

  // A budget over app=a with one disruption to give. The status is written
  // through its subresource, as the disruption controller would.
  const std::string pdbs = "/apis/policy/v1/namespaces/ml/poddisruptionbudgets";
  nlohmann::json pdb = {{"apiVersion", "policy/v1"},
                        {"kind", "PodDisruptionBudget"},
                        {"metadata", {{"name", "a-budget"}}},
                        {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", "a"}}}}}}}};
  ASSERT_TRUE(client->Post(pdbs, pdb.dump()).ok());
  nlohmann::json status = {{"status",
                            {{"disruptionsAllowed", 1},
                             {"currentHealthy", 2},
                             {"desiredHealthy", 1},
                             {"expectedPods", 2}}}};
  ASSERT_TRUE(client->Patch(pdbs + "/a-budget/status", status.dump(), PatchType::kMerge).ok());
  auto allowed = [&] {
    return nlohmann::json::parse(*client->Get(pdbs + "/a-budget"))["status"]["disruptionsAllowed"];
  };

  ASSERT_TRUE(EvictPod(*client, "ml", "trainer-0", uid0).ok());
  EXPECT_EQ(client->Get("/api/v1/namespaces/ml/pods/trainer-0").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(allowed(), 0);

  // The budget is spent: the second pod stays.
  absl::Status s = EvictPod(*client, "ml", "trainer-1", uid1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("disruption budget"));
  EXPECT_TRUE(client->Get("/api/v1/namespaces/ml/pods/trainer-1").ok());
  EXPECT_EQ(allowed(), 0);

  // A pod outside the budget, but replaced (another uid): refused, kept.
  s = EvictPod(*client, "ml", "infer-0", "not-the-uid");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_TRUE(client->Get("/api/v1/namespaces/ml/pods/infer-0").ok());

  EXPECT_EQ(EvictPod(*client, "ml", "trainer-0", uid0).code(), absl::StatusCode::kNotFound);

  // What went on the wire: a policy/v1 Eviction, the uid only when given.
  ASSERT_TRUE(EvictPod(*client, "ml", "infer-0", "").ok());
  std::vector<nlohmann::json> bodies;
  for (const auto& r : fake.Requests()) {
    if (r["method"] == "POST" && r["path"] == "/api/v1/namespaces/ml/pods/infer-0/eviction") {
      bodies.push_back(nlohmann::json::parse(r["body"].get<std::string>()));
    }
  }
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_EQ(bodies[0], (nlohmann::json{{"apiVersion", "policy/v1"},
                                       {"kind", "Eviction"},
                                       {"metadata", {{"name", "infer-0"}, {"namespace", "ml"}}},
                                       {"deleteOptions", {{"preconditions", {{"uid", "not-the-uid"}}}}}}));
  EXPECT_FALSE(bodies[1].contains("deleteOptions"));
}

}  // namespace
}  // namespace k8s
}  // namespace duet
