// Bind against the fake kube-apiserver (tests/fakes/fake_apiserver.py, the
// real binding protocol) through the production PodApi and libcurl client:
// success, rollback when the Binding POST fails, idempotent retries, the
// last free GPUs raced by two pods, and the Slurm placeholder path (with a
// fake SlurmClient that allocates like select/cons_tres on one node). Over
// the real HTTPS server with kube-scheduler's client certificate: /bind
// acts only for duet's pods, and every bind is one log line and a count.

#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/slurm/placeholders.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/extender/extender.h"
#include "k8s_adapter/extender/server.h"
#include "prometheus/text_serializer.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/k8s_adapter/extender/client_certs.h"
#include "tests/k8s_adapter/extender/http_client.h"
#include "tests/k8s_adapter/extender/cluster.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace extender {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using k8s::testing::FakeApiServer;

const std::string kNode0 = bench::H100NodeName(0);  // 8 free
const std::string kNode1 = bench::H100NodeName(1);  // 2 free

json GpuPod(const std::string& name, int gpus) {
  return {{"kind", "Pod"},
          {"apiVersion", "v1"},
          {"metadata", {{"name", name}, {"namespace", "ml-team"}}},
          {"spec",
           {{"schedulerName", "duet"},
            {"containers",
             {{{"name", "c"},
               {"image", "i"},
               {"resources",
                {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}, {"cpu", "4"}, {"memory", "32Gi"}}}}}}}}}}};
}

// The production PodApi, with failures injected at the fake server right
// before the Binding POST, or a stale GET (as if the first try's answer was
// lost after its POST landed).
class TestPodApi final : public PodApi {
 public:
  TestPodApi(FakeApiServer* fake, k8s::KubeClient* client) : fake_(fake), real_(NewKubePodApi(client)) {}
  absl::StatusOr<json> GetPod(const std::string& ns, const std::string& name) override {
    absl::StatusOr<json> pod = real_->GetPod(ns, name);
    if (pod.ok() && stale_gets_ > 0) {
      --stale_gets_;
      (*pod)["spec"].erase("nodeName");
    }
    return pod;
  }
  absl::Status Bind(const std::string& ns, const std::string& name, const std::string& uid,
                    const std::string& node) override {
    if (fail_binds_ > 0) {
      --fail_binds_;
      fake_->Control("fail", {{"count", 1}, {"code", 500}});
    }
    binds_.fetch_add(1);
    return real_->Bind(ns, name, uid, node);
  }
  std::atomic<int> fail_binds_{0};
  std::atomic<int> stale_gets_{0};
  std::atomic<int> binds_{0};

 private:
  FakeApiServer* fake_;
  std::unique_ptr<PodApi> real_;
};

class BindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    testing::BuildCluster(ledger_);
    k8s::KubeConfig c;
    c.server = fake_.url();
    client_ = *k8s::NewCurlKubeClient(c);
    api_ = std::make_unique<TestPodApi>(&fake_, client_.get());
  }

  std::unique_ptr<Extender> Make(Placeholders* placeholders = nullptr) {
    ExtenderOptions o;
    o.wait_durable = [this](uint64_t seq) {
      durable_waits_.fetch_add(1);
      EXPECT_LE(seq, ledger_.seq());
      return absl::OkStatus();
    };
    o.on_refusal = [this](const k8s::EventSpec& e) {
      absl::MutexLock l(&mu_);
      events_.push_back(e);
    };
    o.on_placeholder = [this](const std::string& node, const placement::NodeLoad& load) {
      absl::MutexLock l(&mu_);
      placeholder_loads_.emplace_back(node, load);
    };
    return std::make_unique<Extender>(&ledger_, placeholders, api_.get(), o);
  }

  // Creates the pod in the fake; returns binding args for `node`.
  BindingArgs Pod(const std::string& name, int gpus, const std::string& node) {
    json pod = fake_.Put(GpuPod(name, gpus));
    return {name, "ml-team", pod["metadata"]["uid"].get<std::string>(), node};
  }
  std::string BoundNode(const std::string& name) {
    json pod = json::parse(*client_->Get("/api/v1/namespaces/ml-team/pods/" + name));
    return pod["spec"].value("nodeName", "");
  }
  std::vector<Holding> PodHoldings(const std::string& node) {
    std::vector<Holding> out;
    for (const Holding& h : ledger_.ListHoldings(node)) {
      if (h.owner.holder_class() == HolderClass::kPod && h.owner.pod_name != "other") out.push_back(h);
    }
    return out;
  }

  FakeApiServer fake_;
  Ledger ledger_;
  std::unique_ptr<k8s::KubeClient> client_;
  std::unique_ptr<TestPodApi> api_;
  std::atomic<int> durable_waits_{0};
  absl::Mutex mu_;
  std::vector<k8s::EventSpec> events_;
  std::vector<std::pair<std::string, placement::NodeLoad>> placeholder_loads_;
};

TEST_F(BindTest, HoldsTheDevicesDurablyThenBinds) {
  auto ext = Make();
  BindingArgs a = Pod("trainer-0", 2, kNode0);
  ASSERT_TRUE(ext->Bind(a).ok());
  EXPECT_EQ(BoundNode("trainer-0"), kNode0);
  std::vector<Holding> h = PodHoldings(kNode0);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].owner.kind, OwnerKind::kPod);
  EXPECT_EQ(h[0].owner.pod_uid, a.pod_uid);
  EXPECT_EQ(h[0].devices.size(), 2u);
  EXPECT_GE(durable_waits_.load(), 1);
  EXPECT_EQ(ext->stats().bound, 1u);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

TEST_F(BindTest, FailedBindingPostRollsBackAndReportsTheError) {
  auto ext = Make();
  BindingArgs a = Pod("trainer-1", 2, kNode0);
  api_->fail_binds_ = 1;
  absl::Status s = ext->Bind(a);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("injected failure"));
  EXPECT_TRUE(PodHoldings(kNode0).empty());  // rolled back
  EXPECT_EQ(BoundNode("trainer-1"), "");
  EXPECT_EQ(ext->stats().rolled_back, 1u);
  {
    absl::MutexLock l(&mu_);
    ASSERT_EQ(events_.size(), 1u);
    EXPECT_EQ(events_[0].object_name, "trainer-1");
    EXPECT_EQ(events_[0].object_uid, a.pod_uid);
    EXPECT_EQ(events_[0].type, "Warning");
    EXPECT_THAT(events_[0].message, HasSubstr(kNode0));
  }
  // kube-scheduler retries; this time it works.
  ASSERT_TRUE(ext->Bind(a).ok());
  EXPECT_EQ(PodHoldings(kNode0).size(), 1u);
  EXPECT_EQ(BoundNode("trainer-1"), kNode0);
}

TEST_F(BindTest, RetriedBindIsIdempotent) {
  auto ext = Make();
  BindingArgs a = Pod("trainer-2", 1, kNode0);
  ASSERT_TRUE(ext->Bind(a).ok());
  const uint64_t seq = ledger_.seq();
  // The answer was lost; the scheduler asks again: the pod is bound there.
  ASSERT_TRUE(ext->Bind(a).ok());
  // And once more with a GET that has not seen the binding yet: the holding
  // is found (no second one) and the Binding's 409 means "already there".
  api_->stale_gets_ = 1;
  ASSERT_TRUE(ext->Bind(a).ok());
  EXPECT_EQ(ledger_.seq(), seq);  // nothing changed in the ledger
  EXPECT_EQ(PodHoldings(kNode0).size(), 1u);
  EXPECT_EQ(ext->stats().retries_idempotent, 2u);
  // Bound elsewhere already: refused, nothing held there.
  BindingArgs other = a;
  other.node = bench::H100NodeName(3);
  absl::Status s = ext->Bind(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(PodHoldings(other.node).empty());
}

TEST_F(BindTest, ReplacedOrMissingPodIsRefused) {
  auto ext = Make();
  BindingArgs a = Pod("trainer-3", 1, kNode0);
  a.pod_uid = "not-the-uid";
  EXPECT_EQ(ext->Bind(a).code(), absl::StatusCode::kAborted);
  BindingArgs gone{"gone", "ml-team", "u", kNode0};
  EXPECT_EQ(ext->Bind(gone).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(PodHoldings(kNode0).empty());
}

TEST_F(BindTest, NoRoomIsRefusedWithTheReason) {
  auto ext = Make();
  BindingArgs a = Pod("big", 4, kNode1);  // 2 free
  absl::Status s = ext->Bind(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 8 gpu devices"));
  EXPECT_EQ(api_->binds_.load(), 0);  // never POSTed
  EXPECT_EQ(BoundNode("big"), "");
}

TEST_F(BindTest, PodWithoutDevicesIsJustBound) {
  auto ext = Make();
  json pod = GpuPod("web", 0);
  pod["spec"]["containers"][0]["resources"]["limits"].erase("nvidia.com/gpu");
  json made = fake_.Put(pod);
  ASSERT_TRUE(ext->Bind({"web", "ml-team", made["metadata"]["uid"], "gke-cpu-pool-n2-0"}).ok());
  EXPECT_EQ(BoundNode("web"), "gke-cpu-pool-n2-0");
  EXPECT_EQ(durable_waits_.load(), 0);
}

// Two pods race for the last two GPUs of a node: exactly one wins, the other
// is refused, and the ledger shows one holder. Repeated to give the race
// every chance.
TEST_F(BindTest, ConcurrentBindsForTheLastFreeGpusExactlyOneWins) {
  auto ext = Make();
  for (int round = 0; round < 15; ++round) {
    BindingArgs a = Pod(absl::StrCat("race-a-", round), 2, kNode1);
    BindingArgs b = Pod(absl::StrCat("race-b-", round), 2, kNode1);
    absl::Status sa, sb;
    std::atomic<int> ready{0};
    auto run = [&](const BindingArgs& args, absl::Status* out) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      *out = ext->Bind(args);
    };
    std::thread ta(run, std::cref(a), &sa);
    std::thread tb(run, std::cref(b), &sb);
    ta.join();
    tb.join();
    ASSERT_NE(sa.ok(), sb.ok()) << "round " << round << ": " << sa << " / " << sb;
    const absl::Status& lost = sa.ok() ? sb : sa;
    EXPECT_EQ(lost.code(), absl::StatusCode::kResourceExhausted) << lost;
    std::vector<Holding> h = PodHoldings(kNode1);
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0].owner.pod_uid, sa.ok() ? a.pod_uid : b.pod_uid);
    EXPECT_EQ(BoundNode(sa.ok() ? a.pod_name : b.pod_name), kNode1);
    EXPECT_EQ(BoundNode(sa.ok() ? b.pod_name : a.pod_name), "");
    ASSERT_TRUE(ledger_.CheckInvariants().ok());
    // The winner's pod ends: free the GPUs for the next round.
    ASSERT_TRUE(ledger_.Release(kNode1, h[0].owner).ok());
  }
}

TEST_F(BindTest, SlurmPlaceholderIsMadeAndCancelledOnFailure) {
  fakes::FakeSlurmClient slurm;
  slurm.Use(kNode1, 0, 6);  // Slurm job 101 of the cluster
  Placeholders placeholders(&ledger_, &slurm);
  auto ext = Make(&placeholders);

  BindingArgs a = Pod("slurm-pod", 2, kNode1);
  api_->fail_binds_ = 1;
  EXPECT_FALSE(ext->Bind(a).ok());
  EXPECT_EQ(slurm.asked().size(), 1u);
  EXPECT_EQ(slurm.killed().size(), 1u);  // Placeholders::Cancel
  EXPECT_EQ(slurm.live_jobs(), 0u);
  EXPECT_TRUE(PodHoldings(kNode1).empty());

  ASSERT_TRUE(ext->Bind(a).ok());
  EXPECT_EQ(slurm.asked().size(), 2u);
  EXPECT_EQ(slurm.asked().back().gpus, 2u);
  EXPECT_EQ(slurm.asked().back().cpus, 4u);
  EXPECT_EQ(slurm.asked().back().memory_mib, 32u * 1024);
  EXPECT_THAT(slurm.asked().back().comment, HasSubstr(a.pod_uid));
  std::vector<Holding> h = PodHoldings(kNode1);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].owner.kind, OwnerKind::kPlaceholder);
  EXPECT_EQ(h[0].devices.size(), 2u);
  EXPECT_EQ(h[0].devices[0].index, 6u);  // Slurm's choice, recorded as is
  {
    // Each placeholder made reports the CPU/memory it asked of Slurm.
    absl::MutexLock l(&mu_);
    ASSERT_EQ(placeholder_loads_.size(), 2u);
    EXPECT_EQ(placeholder_loads_[1].first, kNode1);
    EXPECT_EQ(placeholder_loads_[1].second.cpu_milli, 4000u);
    EXPECT_EQ(placeholder_loads_[1].second.memory_mib, 32u * 1024);
  }

  // A retry: no second placeholder.
  ASSERT_TRUE(ext->Bind(a).ok());
  EXPECT_EQ(slurm.asked().size(), 2u);
  // Another pod: the node is full in the ledger; Slurm is not even asked.
  BindingArgs b = Pod("slurm-pod-2", 1, kNode1);
  EXPECT_EQ(ext->Bind(b).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(slurm.asked().size(), 2u);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

// The attack of issue 25: a pending pod of another scheduler (kube-system,
// default-scheduler, no GPU) sent to /bind for a made-up node. Over HTTPS
// with the scheduler's client certificate, /bind refuses it, an unknown pod
// and a pod whose uid does not match, and POSTs no Binding for any of them;
// duet's own pod is bound. Each bind is one log line naming the caller's
// certificate, and duet_extender_binds_total counts them by result.
class BindOverHttpsTest : public BindTest {
 protected:
  void SetUp() override {
    BindTest::SetUp();
    dir_ = k8s::testing::MakeTempDir();
    server_tls_ = k8s::testing::MakeTestCerts(dir_);
    ASSERT_FALSE(server_tls_.cert.empty()) << "openssl failed";
    sched_ = testing::MakeSchedulerClientCert(dir_);
    ASSERT_FALSE(sched_.cert.empty()) << "openssl failed";
    ext_ = Make();
    ServerOptions o;
    o.tls.cert_file = server_tls_.cert;
    o.tls.key_file = server_tls_.key;
    o.tls.client_ca_file = sched_.ca;
    o.registry = registry_;
    auto s = ExtenderServer::Start(ext_.get(), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    client_https_ = std::make_unique<testing::HttpClient>(server_->port(), server_tls_.ca,
                                                          sched_.cert, sched_.key);
    spdlog::default_logger()->sinks().push_back(ring_);
  }
  void TearDown() override {
    spdlog::default_logger()->sinks().pop_back();
    if (server_ != nullptr) server_->Stop();
    k8s::testing::RemoveTree(dir_);
  }

  // The ExtenderBindingResult's Error ("" when bound).
  std::string PostBind(const std::string& ns, const std::string& name, const std::string& uid,
                       const std::string& node) {
    json args = {{"PodName", name}, {"PodNamespace", ns}, {"PodUID", uid}, {"Node", node}};
    absl::StatusOr<testing::Reply> r = client_https_->Post("/duet/bind", args.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "no answer";
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body).value("Error", "not an ExtenderBindingResult");
  }
  int BindingPosts() {
    int n = 0;
    for (const json& r : fake_.Requests()) {
      const std::string path = r.value("path", "");
      if (r.value("method", "") == "POST" &&
          (path.find("/binding") != std::string::npos)) {
        ++n;
      }
    }
    return n;
  }
  std::vector<std::string> LogLines(spdlog::level::level_enum level) {
    std::vector<std::string> out;
    for (const spdlog::details::log_msg_buffer& m : ring_->last_raw()) {
      const std::string text(m.payload.data(), m.payload.size());
      if (m.level == level && text.rfind("extender bind:", 0) == 0) out.push_back(text);
    }
    return out;
  }

  std::string dir_;
  k8s::testing::TlsFiles server_tls_;
  testing::ClientCert sched_;
  std::unique_ptr<Extender> ext_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<ExtenderServer> server_;
  std::unique_ptr<testing::HttpClient> client_https_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring_ =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
};

TEST_F(BindOverHttpsTest, OnlyDuetsOwnPodsAreBound) {
  const uint64_t seq = ledger_.seq();
  // Another scheduler's pending pod that asks for no device.
  json system_pod = GpuPod("coredns-x", 0);
  system_pod["metadata"]["namespace"] = "kube-system";
  system_pod["spec"]["schedulerName"] = "default-scheduler";
  system_pod["spec"]["containers"][0]["resources"]["limits"].erase("nvidia.com/gpu");
  const std::string system_uid = fake_.Put(system_pod)["metadata"]["uid"];
  std::string error = PostBind("kube-system", "coredns-x", system_uid, "made-up-node");
  EXPECT_THAT(error, HasSubstr("spec.schedulerName is \"default-scheduler\", not one of duet's"));
  // Without a schedulerName (the API server defaults it; a pod JSON may not
  // carry it): not duet's either.
  system_pod["metadata"]["name"] = "no-scheduler";
  system_pod["spec"].erase("schedulerName");
  const std::string bare_uid = fake_.Put(system_pod)["metadata"]["uid"];
  EXPECT_THAT(PostBind("kube-system", "no-scheduler", bare_uid, kNode0),
              HasSubstr("spec.schedulerName is \"\""));
  // Unknown pod.
  EXPECT_THAT(PostBind("ml-team", "nobody", "u-1", kNode0), HasSubstr("cannot bind pod ml-team/nobody"));
  // duet's pod, but the binding's uid is another's, or missing.
  BindingArgs a = Pod("trainer-9", 2, kNode0);
  EXPECT_THAT(PostBind("ml-team", "trainer-9", "not-the-uid", kNode0), HasSubstr("the pod was replaced"));
  EXPECT_THAT(PostBind("ml-team", "trainer-9", "", kNode0),
              HasSubstr("ExtenderBindingArgs.PodUID: must be set"));

  EXPECT_EQ(BindingPosts(), 0);
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_TRUE(PodHoldings(kNode0).empty());
  EXPECT_EQ(BoundNode("trainer-9"), "");
  {
    json pod = json::parse(*client_->Get("/api/v1/namespaces/kube-system/pods/coredns-x"));
    EXPECT_EQ(pod["spec"].value("nodeName", ""), "");
  }

  // duet's pod with its uid: held and bound.
  EXPECT_EQ(PostBind("ml-team", "trainer-9", a.pod_uid, kNode0), "");
  EXPECT_EQ(BindingPosts(), 1);
  EXPECT_EQ(BoundNode("trainer-9"), kNode0);
  ASSERT_EQ(PodHoldings(kNode0).size(), 1u);

  // One line per bind, naming the caller's certificate and what was done.
  const std::vector<std::string> refused = LogLines(spdlog::level::warn);
  ASSERT_EQ(refused.size(), 5u);
  EXPECT_THAT(refused[0], HasSubstr("result=refused caller=\"CN=duet-scheduler at 127.0.0.1:"));
  EXPECT_THAT(refused[0], HasSubstr(absl::StrCat("pod=kube-system/coredns-x uid=", system_uid,
                                                 " node=made-up-node devices=[] error=")));
  const std::vector<std::string> bound = LogLines(spdlog::level::info);
  ASSERT_EQ(bound.size(), 1u);
  EXPECT_THAT(bound[0], HasSubstr("result=bound caller=\"CN=duet-scheduler at 127.0.0.1:"));
  EXPECT_THAT(bound[0], HasSubstr(absl::StrCat("pod=ml-team/trainer-9 uid=", a.pod_uid, " node=",
                                               kNode0, " devices=[gpu")));
  const std::string m = prometheus::TextSerializer().Serialize(registry_->Collect());
  EXPECT_THAT(m, HasSubstr("duet_extender_binds_total{result=\"refused\"} 5"));
  EXPECT_THAT(m, HasSubstr("duet_extender_binds_total{result=\"bound\"} 1"));
  EXPECT_THAT(m, HasSubstr("duet_extender_binds_total{result=\"invalid\"} 0"));
}

// The same check without HTTP: another scheduler's pod is refused before
// anything is held, even one that asks for GPUs on a free node; a pod of a
// second configured profile is bound.
TEST_F(BindTest, OtherSchedulersPodsAreRefusedAndConfiguredNamesAccepted) {
  auto ext = Make();
  json pod = GpuPod("foreign", 2);
  pod["spec"]["schedulerName"] = "volcano";
  const std::string uid = fake_.Put(pod)["metadata"]["uid"];
  absl::Status s = ext->Bind({"foreign", "ml-team", uid, kNode0});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(PodHoldings(kNode0).empty());
  EXPECT_EQ(api_->binds_.load(), 0);

  ExtenderOptions o;
  o.scheduler_names = {"duet", "volcano"};
  Extender both(&ledger_, nullptr, api_.get(), o);
  ASSERT_TRUE(both.Bind({"foreign", "ml-team", uid, kNode0}).ok());
  EXPECT_EQ(BoundNode("foreign"), kNode0);
}

}  // namespace
}  // namespace extender
}  // namespace duet
