// duet-bridge (in process) with the Kubernetes inventory: the pod watch is
// wired in, releases a deleted pod's holding, counts it in
// duet_pod_releases_total, posts a DuetReleased Event on the pod, and
// exports the watches' counters. Also the config keys it reads.

#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "bridge/config/config.h"
#include "bridge/server/bridge.h"
#include "bridge/server/leadership.h"
#include "bridge/server/sync_events.h"
#include "gtest/gtest.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

using k8s::testing::FakeApiServer;
using k8s::testing::GoldenNode;
using k8s::testing::WaitFor;

nlohmann::json BoundPod(const std::string& name, const std::string& uid, const std::string& node) {
  return {{"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", uid}}},
          {"spec", {{"nodeName", node}, {"containers", {{{"name", "c"}, {"image", "x"}}}}}},
          {"status", {{"phase", "Running"}}}};
}

TEST(BridgePodsTest, DeletedPodIsReleasedCountedAndReported) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gke-a3-1"));
  fake.Put(BoundPod("train-0", "uid-train-0", "gke-a3-1"));
  fake.Put(BoundPod("train-1", "uid-train-1", "gke-a3-1"));

  const std::string dir = k8s::testing::MakeTempDir();
  k8s::testing::WriteKubeconfig(dir + "/kubeconfig", fake.url());
  Config config;
  config.grpc.listen = "127.0.0.1:0";
  config.metrics.listen = "";
  config.journal.dir = dir + "/journal";
  config.journal.fsync = false;
  config.kubernetes.kubeconfig = dir + "/kubeconfig";
  config.kubernetes.pod_sweep_period = absl::Milliseconds(200);
  ASSERT_TRUE(config.kubernetes.watch_pods);  // the default
  ASSERT_TRUE(ValidateConfig(config).ok());
  auto bridge = Bridge::Start(config);
  ASSERT_TRUE(bridge.ok()) << bridge.status();
  Bridge* b = bridge->get();
  ASSERT_NE(b->pod_watch(), nullptr);
  ASSERT_NE(b->events(), nullptr);
  EXPECT_EQ(b->pod_watch()->stats().pods, 2u);

  for (const char* uid : {"uid-train-0", "uid-train-1"}) {
    HoldRequest r;
    r.node = "gke-a3-1";
    r.owner = Owner::Pod(uid, "ml", std::string("train-") + uid[10]);
    r.count = CountSelector{DeviceKind::kGpu, 4, 0, ""};
    ASSERT_TRUE(b->ledger()->Hold(r).ok());
  }
  fake.Delete("Pod", "train-0", "ml");
  ASSERT_TRUE(WaitFor([&] { return b->ledger()->holding_count() == 1; }));
  EXPECT_TRUE(b->ledger()->FindHolding("gke-a3-1", Owner::Pod("uid-train-1")).has_value());

  // The release is counted just after the ledger lets the holding go.
  std::string text;
  EXPECT_TRUE(WaitFor([&] {
    text = b->metrics()->Render();
    return text.find("duet_pod_releases_total{reason=\"deleted\"} 1") != std::string::npos;
  })) << text;
  EXPECT_NE(text.find("duet_pod_releases_total{reason=\"orphaned\"} 0"), std::string::npos);
  EXPECT_NE(text.find("duet_k8s_watch_events_total{resource=\"pods\"}"), std::string::npos);
  EXPECT_NE(text.find("duet_k8s_watch_events_total{resource=\"nodes\"}"), std::string::npos);
  EXPECT_NE(text.find("duet_k8s_watch_relists_total{resource=\"pods\"} 0"), std::string::npos);

  // The Event on the pod.
  ASSERT_TRUE(WaitFor([&] { return b->events()->stats().posted == 1; }));
  auto events = fake.control()->Get("/api/v1/namespaces/ml/events");
  ASSERT_TRUE(events.ok());
  nlohmann::json items = nlohmann::json::parse(*events)["items"];
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0]["reason"], "DuetReleased");
  EXPECT_EQ(items[0]["type"], "Normal");
  EXPECT_EQ(items[0]["involvedObject"]["name"], "train-0");
  EXPECT_EQ(items[0]["involvedObject"]["uid"], "uid-train-0");
  EXPECT_NE(items[0]["message"].get<std::string>().find("gke-a3-1"), std::string::npos);
  EXPECT_NE(b->metrics()->Render().find("duet_k8s_events_total{result=\"posted\"} 1"),
            std::string::npos);
  bridge->reset();
  k8s::testing::RemoveTree(dir);
}

TEST(BridgePodsTest, WatchPodsOffMeansNoPodWatch) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gke-a3-1"));
  const std::string dir = k8s::testing::MakeTempDir();
  k8s::testing::WriteKubeconfig(dir + "/kubeconfig", fake.url());
  auto config = ParseConfig(absl::StrCat("grpc: {listen: \"127.0.0.1:0\"}\nmetrics: {listen: \"\"}\n",
                                         "journal: {dir: ", dir, "/journal, fsync: false}\n",
                                         "kubernetes: {kubeconfig: ", dir, "/kubeconfig, ",
                                         "watch_pods: false, events_per_minute: 0}\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  auto bridge = Bridge::Start(*config);
  ASSERT_TRUE(bridge.ok()) << bridge.status();
  EXPECT_EQ((*bridge)->pod_watch(), nullptr);
  EXPECT_EQ((*bridge)->events(), nullptr);
  for (const auto& r : fake.Requests()) {
    EXPECT_EQ(r.value("path", "").find("/pods"), std::string::npos) << r.value("path", "");
  }
  bridge->reset();
  k8s::testing::RemoveTree(dir);
}

TEST(BridgePodsTest, DuetsNodeDrainsBecomeNodeEvents) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  k8s::EventRecorder events(fake.control(), k8s::EventRecorderOptions{});
  auto hook = NodeDrainEvents(&events);
  hook("gke-a3-1", true, "duet: cordoned");
  hook("gke-a3-1", false, "duet: cordoned");
  ASSERT_TRUE(WaitFor([&] { return events.stats().posted == 2; }));
  auto got = fake.control()->Get("/api/v1/namespaces/default/events");
  ASSERT_TRUE(got.ok());
  nlohmann::json items = nlohmann::json::parse(*got)["items"];
  ASSERT_EQ(items.size(), 2u);
  std::set<std::string> reasons;
  for (const auto& e : items) {
    EXPECT_EQ(e["involvedObject"]["kind"], "Node");
    EXPECT_EQ(e["involvedObject"]["name"], "gke-a3-1");
    EXPECT_NE(e["message"].get<std::string>().find("duet: cordoned"), std::string::npos);
    reasons.insert(e["reason"].get<std::string>());
  }
  EXPECT_EQ(reasons, (std::set<std::string>{"DuetDrained", "DuetResumed"}));
}

TEST(PodLifecycleConfigTest, KeysParseWithDefaultsAndValidateWithFieldPaths) {
  Config d;
  EXPECT_TRUE(d.kubernetes.watch_pods);
  EXPECT_EQ(d.kubernetes.events_per_minute, 60);
  EXPECT_FALSE(d.kubernetes.leader_election.enabled);
  EXPECT_EQ(d.kubernetes.leader_election.lease_name, "duet-bridge");
  EXPECT_EQ(d.kubernetes.leader_election.lease_duration, absl::Seconds(15));
  EXPECT_EQ(d.kubernetes.leader_election.renew_deadline, absl::Seconds(10));
  EXPECT_EQ(d.kubernetes.leader_election.retry_period, absl::Seconds(2));

  auto c = ParseConfig(
      "kubernetes:\n"
      "  watch_pods: false\n"
      "  events_per_minute: 12\n"
      "  pod_release_grace: 1m\n"
      "  pod_sweep_period: 5s\n"
      "  leader_election: {enabled: true, namespace: ops, lease_name: duet-x, identity: me,\n"
      "                    lease_duration: 30s, renew_deadline: 20s, retry_period: 4s}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->kubernetes.watch_pods);
  EXPECT_EQ(c->kubernetes.events_per_minute, 12);
  EXPECT_EQ(c->kubernetes.pod_release_grace, absl::Minutes(1));
  EXPECT_EQ(c->kubernetes.pod_sweep_period, absl::Seconds(5));
  const LeaderElectionConfig& le = c->kubernetes.leader_election;
  EXPECT_TRUE(le.enabled);
  EXPECT_EQ(le.lease_namespace, "ops");
  EXPECT_EQ(le.lease_name, "duet-x");
  EXPECT_EQ(le.identity, "me");
  EXPECT_EQ(le.lease_duration, absl::Seconds(30));
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);

  auto bad_key = ParseConfig("kubernetes: {leader_election: {enable: true}}\n");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("kubernetes.leader_election.enable"),
            std::string::npos)
      << bad_key.status();
  auto bad_type = ParseConfig("kubernetes: {events_per_minute: -1}\n");
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.status().message().find("kubernetes.events_per_minute"), std::string::npos);

  Config v;
  v.kubernetes.leader_election.enabled = true;
  v.kubernetes.leader_election.renew_deadline = absl::Seconds(20);  // > lease_duration 15s
  absl::Status s = ValidateConfig(v);
  EXPECT_NE(s.message().find("kubernetes.leader_election.lease_duration"), std::string::npos) << s;
  v = Config();
  v.kubernetes.leader_election.enabled = true;
  v.kubernetes.leader_election.retry_period = absl::Seconds(10);
  s = ValidateConfig(v);
  EXPECT_NE(s.message().find("kubernetes.leader_election.renew_deadline"), std::string::npos) << s;
  v = Config();
  v.kubernetes.pod_sweep_period = absl::Milliseconds(1);
  s = ValidateConfig(v);
  EXPECT_NE(s.message().find("kubernetes.pod_sweep_period"), std::string::npos) << s;
}

TEST(PodLifecycleConfigTest, LeaderIdentityAndNamespaceFallBacks) {
  LeaderElectionConfig le;
  le.identity = "explicit";
  EXPECT_EQ(LeaderIdentity(le), "explicit");
  le.identity = "";
  setenv("POD_NAME", "duet-bridge-7f9c", 1);
  EXPECT_EQ(LeaderIdentity(le), "duet-bridge-7f9c");
  unsetenv("POD_NAME");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(LeaderIdentity(le), host);

  k8s::KubeConfig kc;
  EXPECT_EQ(LeaderNamespace(le, kc), "default");
  kc.namespace_ = "duet-system";  // in-cluster: the service account's namespace file
  EXPECT_EQ(LeaderNamespace(le, kc), "duet-system");
  le.lease_namespace = "ops";
  EXPECT_EQ(LeaderNamespace(le, kc), "ops");
}

}  // namespace
}  // namespace duet
