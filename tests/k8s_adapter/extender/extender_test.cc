// Extender logic and the HTTP/JSON layer without sockets: the exact JSON
// kube-scheduler sends (testdata/filter_args.json: a full v1.Pod asking for
// 4 H100s, NodeNames) against golden results, Kubernetes' effective-request
// rules, and the 400/404/405 answers.

#include "k8s_adapter/extender/extender.h"

#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bridge/placement/workload_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/extender/server.h"
#include "k8s_adapter/extender/types.h"
#include "tests/fakes/wait.h"
#include "tests/k8s_adapter/extender/cluster.h"

namespace duet {
namespace extender {
namespace {

using ::testing::HasSubstr;
using testing::BuildCluster;
using testing::ExpectGolden;
using testing::TestdataJson;
using json = nlohmann::json;

// A PodApi for tests that never reach bind.
class NoApi final : public PodApi {
 public:
  absl::StatusOr<json> GetPod(const std::string&, const std::string&) override {
    return absl::UnavailableError("no API server in this test");
  }
  absl::Status Bind(const std::string&, const std::string&, const std::string&, const std::string&) override {
    return absl::UnavailableError("no API server in this test");
  }
};

json PodWith(const std::vector<json>& containers, const json& extra_spec = json::object()) {
  json pod = {{"metadata", {{"name", "p"}, {"namespace", "default"}, {"uid", "u1"}}},
              {"spec", {{"containers", json(containers)}}}};
  pod["spec"].update(extra_spec);
  return pod;
}

json Container(const json& requests, const json& limits = json::object()) {
  json c = {{"name", "c"}, {"image", "i"}, {"resources", json::object()}};
  if (!requests.empty()) c["resources"]["requests"] = requests;
  if (!limits.empty()) c["resources"]["limits"] = limits;
  return c;
}

TEST(PodRequestTest, GoldenPodAsksFourH100sWithTheLargerOfInitAndAppContainers) {
  json args = TestdataJson("filter_args.json");
  absl::StatusOr<placement::PodRequest> r = ParsePodRequest(args["Pod"]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, DeviceKind::kGpu);
  EXPECT_EQ(r->count, 4u);
  EXPECT_EQ(r->milli, kWholeDevice);
  EXPECT_EQ(r->cpu_milli, 48250u);                  // 48 + 250m (init's 8 is less)
  EXPECT_EQ(r->memory_mib, 400u * 1024 + 256);      // 400Gi + 256Mi
  EXPECT_THAT(r->models, ::testing::ElementsAre("nvidia-h100-80gb"));
}

TEST(PodRequestTest, LimitsStandInForMissingRequests) {
  absl::StatusOr<placement::PodRequest> r =
      ParsePodRequest(PodWith({Container({{"cpu", "1"}}, {{"cpu", "2"}, {"nvidia.com/gpu", "2"}, {"memory", "1G"}})}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->count, 2u);
  EXPECT_EQ(r->cpu_milli, 1000u);   // the request wins over the limit
  EXPECT_EQ(r->memory_mib, 954u);   // 1e9 bytes, rounded up to MiB
}

TEST(PodRequestTest, InitContainersSidecarsAndOverhead) {
  json inits = json::array({
      Container({{"cpu", "500m"}}) /* sidecar, below */,
      Container({{"cpu", "4"}, {"nvidia.com/gpu", "1"}}),
  });
  inits[0]["restartPolicy"] = "Always";
  json pod = PodWith({Container({{"cpu", "1"}, {"nvidia.com/gpu", "1"}})},
                     {{"initContainers", inits}, {"overhead", {{"cpu", "100m"}}}});
  absl::StatusOr<placement::PodRequest> r = ParsePodRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  // max(app 1 + sidecar 0.5, init 4 + sidecar 0.5) + overhead 0.1
  EXPECT_EQ(r->cpu_milli, 4600u);
  EXPECT_EQ(r->count, 1u);  // max(1, 1)
}

TEST(PodRequestTest, TpusModelsAndShares) {
  json pod = PodWith({Container({}, {{"google.com/tpu", "4"}})},
                     {{"nodeSelector", {{"cloud.google.com/gke-tpu-accelerator", "tpu-v5-lite-podslice"}}}});
  absl::StatusOr<placement::PodRequest> r = ParsePodRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, DeviceKind::kTpu);
  EXPECT_EQ(r->count, 4u);
  EXPECT_THAT(r->models, ::testing::ElementsAre("tpu-v5-lite-podslice"));

  json shared = PodWith({Container({}, {{"nvidia.com/gpu", "1"}})});
  shared["metadata"]["annotations"] = {{"duet.dev/device-milli", "500"}, {"duet.dev/models", "a, b"}};
  r = ParsePodRequest(shared);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->milli, 500u);
  EXPECT_TRUE(r->shared());
  EXPECT_THAT(r->models, ::testing::ElementsAre("a", "b"));
}

TEST(PodRequestTest, BadInputNamesTheField) {
  absl::StatusOr<placement::PodRequest> r = ParsePodRequest(PodWith({Container({{"nvidia.com/gpu", "x"}})}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("spec.containers[0].resources.requests[nvidia.com/gpu]"));
  r = ParsePodRequest(PodWith({Container({{"nvidia.com/gpu", "1"}, {"google.com/tpu", "1"}})}));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("both"));
  r = ParsePodRequest(PodWith({Container({{"nvidia.com/gpu", "500m"}})}));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("whole number"));
  r = ParsePodRequest(json{{"spec", json::object()}});
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("spec.containers"));
  json two_shared = PodWith({Container({}, {{"nvidia.com/gpu", "2"}})});
  two_shared["metadata"]["annotations"] = {{"duet.dev/device-milli", "2000"}};
  EXPECT_FALSE(ParsePodRequest(two_shared).ok());
}

TEST(ExtenderArgsTest, NodeListAndCaseInsensitiveKeys) {
  json body = {{"pod", PodWith({Container({})})},
               {"nodes", {{"items", {{{"metadata", {{"name", "a"}}}}, {{"metadata", {{"name", "b"}}}}}}}}};
  absl::StatusOr<ExtenderArgs> a = ParseExtenderArgs(body);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->node_names, ::testing::ElementsAre("a", "b"));
  EXPECT_TRUE(a->from_node_list);

  EXPECT_THAT(std::string(ParseExtenderArgs(json{{"NodeNames", {"a"}}}).status().message()),
              HasSubstr("ExtenderArgs.Pod: missing"));
  EXPECT_THAT(std::string(ParseExtenderArgs(json{{"Pod", json::object()}, {"NodeNames", {"a", 3}}})
                              .status()
                              .message()),
              HasSubstr("ExtenderArgs.NodeNames[1]: not a string"));
  EXPECT_THAT(std::string(ParseExtenderArgs(json{{"Pod", json::object()}}).status().message()),
              HasSubstr("neither NodeNames nor Nodes"));
  EXPECT_THAT(std::string(ParseBindingArgs(json{{"PodName", "a/b"}, {"Node", "n"}}).status().message()),
              HasSubstr("PodName"));
}

// The fast path (simdjson) must give what the general path gives on the
// bodies it takes, and leave every other body to the general path.
TEST(ExtenderArgsTest, FastPathMatchesTheGeneralPathOrDeclines) {
  const json golden = TestdataJson("filter_args.json");
  for (const std::string& body :
       {golden.dump(), golden.dump(2), std::string(" \n") + golden.dump() + " \n",
        json{{"NodeNames", {"a", "b\u00e9\"q"}}, {"Pod", PodWith({Container({})})}}.dump(),
        json{{"Pod", PodWith({Container({})})}, {"NodeNames", json::array()}, {"Nodes", nullptr}}.dump()}) {
    SCOPED_TRACE(body.substr(0, 80));
    std::optional<ExtenderArgs> fast = ParseExtenderArgsFast(body);
    absl::StatusOr<ExtenderArgs> general = ParseExtenderArgs(json::parse(body));
    ASSERT_TRUE(general.ok()) << general.status();
    ASSERT_TRUE(fast.has_value());
    EXPECT_EQ(fast->pod, general->pod);
    EXPECT_EQ(fast->node_names, general->node_names);
    EXPECT_FALSE(fast->from_node_list);
  }
  const json pod = PodWith({Container({})});
  for (const std::string& body : {
           std::string("not json"),
           json{{"pod", pod}, {"NodeNames", {"a"}}}.dump(),            // other case
           json{{"Pod", pod}, {"NodeNames", {"a"}}, {"X", 1}}.dump(),  // another key
           json{{"Pod", pod}, {"NodeNames", {"a", 3}}}.dump(),         // not a string
           json{{"Pod", pod}, {"NodeNames", nullptr}}.dump(),
           json{{"Pod", "x"}, {"NodeNames", {"a"}}}.dump(),
           json{{"Pod", pod}}.dump(),
           json{{"NodeNames", {"a"}}}.dump(),
           json{{"Pod", pod}, {"Nodes", {{"items", json::array()}}}, {"NodeNames", {"a"}}}.dump(),
           json{{"Pod", pod}, {"NodeNames", {"a"}}}.dump() + " x",  // trailing content
           json{{"Pod", pod}, {"NodeNames", {"a"}}}.dump() + "{}",
           std::string(R"({"Pod":{},"NodeNames":["a"],"Pod":{}})"),  // a key twice
           std::string(R"({"Pod":{"a":tru},"NodeNames":["a"]})"),
           std::string(R"({"Pod":{},"NodeNames":["a"])"),
       }) {
    SCOPED_TRACE(body.substr(0, 80));
    EXPECT_FALSE(ParseExtenderArgsFast(body).has_value());
  }
}

// The DOM-free writers give nlohmann's bytes, escapes and bad UTF-8 included.
TEST(ExtenderArgsTest, DirectWritersMatchNlohmannsDump) {
  auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  FilterResult r;
  EXPECT_EQ(FilterResultBody(r), dump(FilterResultJson(r)));
  r.node_names = {"a", "b\"c", "d\\e\n", "\xc3\xa9t\xe9"};  // the last: invalid UTF-8
  r.failed = {{"n2", "duet: 1 of 8 \"gpu\""}, {"n1", "x\ty"}};
  r.failed_unresolvable = {{"z", "duet: node is cordoned"}};
  r.error = "oops\x01";
  EXPECT_EQ(FilterResultBody(r), dump(FilterResultJson(r)));
  std::vector<HostPriority> list = {{"a", 10}, {"b\"", 0}, {"c", -3}};
  EXPECT_EQ(PriorityListBody(list), dump(PriorityListJson(list)));
  EXPECT_EQ(PriorityListBody({}), dump(PriorityListJson({})));
  // Names and scores given apart (the server's path): the same bytes.
  EXPECT_EQ(PriorityListBody({"a", "b\"", "c"}, {10, 0, -3}), dump(PriorityListJson(list)));
  EXPECT_EQ(PriorityListBody(std::vector<std::string>{}, std::vector<int64_t>{}),
            dump(PriorityListJson({})));
  // A NodeList request is answered with the NodeList (DOM path).
  ExtenderArgs args;
  args.from_node_list = true;
  args.node_list = {{"items", {{{"metadata", {{"name", "a"}}}}, {{"metadata", {{"name", "b"}}}}}}};
  FilterResult one;
  one.node_names = {"b"};
  EXPECT_EQ(FilterResultBody(one, &args), dump(FilterResultJson(one, &args)));
}

class ExtenderTest : public ::testing::Test {
 protected:
  void SetUp() override { BuildCluster(ledger_); }
  Ledger ledger_;
  NoApi api_;
  Extender extender_{&ledger_, nullptr, &api_, ExtenderOptions{}};
};

TEST_F(ExtenderTest, FilterGolden) {
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(TestdataJson("filter_args.json"));
  ASSERT_TRUE(args.ok()) << args.status();
  FilterResult r = extender_.Filter(*args);
  // 8 free, 4 free and 5 free pass; 2 free fails; L4 fails (model); cordoned
  // and unknown are unresolvable.
  EXPECT_THAT(r.node_names, ::testing::ElementsAre("gke-a3-highgpu-pool-0", "gke-a3-highgpu-pool-3",
                                                   "gke-a3-highgpu-pool-4"));
  ExpectGolden(FilterResultJson(r, &*args), "filter_result.json");
}

TEST_F(ExtenderTest, PrioritizeGoldenPrefersTheNodeThePodFillsAndAvoidsStrandingAGpu) {
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(TestdataJson("filter_args.json"));
  ASSERT_TRUE(args.ok());
  std::vector<HostPriority> p = extender_.Prioritize(*args);
  ASSERT_EQ(p.size(), 7u);
  for (const HostPriority& h : p) {
    EXPECT_GE(h.score, 0);
    EXPECT_LE(h.score, kMaxExtenderPriority);
  }
  // duet's policy: pool-3 (4 free, the pod takes them all) is best; the
  // empty pool-0 (4 left, still usable by such a pod) next; pool-4 (5 free)
  // worst, as it would strand one GPU that no 4-GPU pod can use. Nodes where
  // the pod does not fit score 0.
  EXPECT_EQ(p[3].score, kMaxExtenderPriority);
  EXPECT_GT(p[3].score, p[0].score);
  EXPECT_GT(p[0].score, p[4].score);
  EXPECT_EQ(p[1].score, 0);
  EXPECT_EQ(p[2].score, 0);
  EXPECT_EQ(p[5].score, 0);
  EXPECT_EQ(p[6].score, 0);
  ExpectGolden(PriorityListJson(p), "prioritize_result.json");
}

// Prioritize reads the extender's node table, which the ledger's change
// listener patches: a hold, a release, a node added or removed is seen by the
// very next prioritize, with no wait.
TEST_F(ExtenderTest, PrioritizeSeesEachLedgerChangeAtOnce) {
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(TestdataJson("filter_args.json"));
  ASSERT_TRUE(args.ok());
  const std::vector<HostPriority> before = extender_.Prioritize(*args);
  ASSERT_EQ(before.size(), 7u);
  ASSERT_EQ(before[3].score, kMaxExtenderPriority);  // pool-3: 4 free, the pod's 4
  // Two more of pool-3's GPUs held: the pod no longer fits there.
  testing::HoldSlurm(ledger_, bench::H100NodeName(3), 104, 4, 2);
  std::vector<HostPriority> p = extender_.Prioritize(*args);
  EXPECT_EQ(p[3].score, 0);
  EXPECT_GT(p[0].score, 0);
  // Released: the scores are those from before, exactly.
  ASSERT_TRUE(ledger_.Release(bench::H100NodeName(3), Owner::SlurmJob(104)).ok());
  p = extender_.Prioritize(*args);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i].score, before[i].score) << p[i].host;
  // A node that joins the ledger is scored (an empty H100 node, as pool-0);
  // once removed it scores 0 again.
  const std::string joined = args->node_names[6];
  ASSERT_EQ(p[6].score, 0);
  NodeSpec spec = bench::H100Node(6);
  spec.name = joined;
  ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
  p = extender_.Prioritize(*args);
  EXPECT_GT(p[6].score, 0);
  EXPECT_EQ(p[6].score, p[0].score);
  ASSERT_TRUE(ledger_.RemoveNode(joined).ok());
  p = extender_.Prioritize(*args);
  EXPECT_EQ(p[6].score, 0);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i].score, before[i].score) << p[i].host;
}

// Domain packing (docs/gangs.md 4): two empty nodes alike but for their
// block; the one whose block already has a busy node wins, so block B stays
// whole for a gang.
TEST(ExtenderDomainTest, PrioritizePrefersTheNodeInAPartlyUsedBlock) {
  Ledger ledger;
  const char* blocks[] = {"A", "A", "B"};
  for (int i = 0; i < 3; ++i) {
    NodeSpec spec = bench::H100Node(10 + i);
    spec.labels["cloud.google.com/gce-topology-block"] = blocks[i];
    ASSERT_TRUE(ledger.UpsertNode(spec).ok());
  }
  testing::HoldSlurm(ledger, bench::H100NodeName(10), 101, 0, 6);
  NoApi api;
  Extender extender(&ledger, nullptr, &api, ExtenderOptions{});
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(TestdataJson("filter_args.json"));
  ASSERT_TRUE(args.ok());
  args->node_names = {bench::H100NodeName(11), bench::H100NodeName(12)};
  std::vector<HostPriority> p = extender.Prioritize(*args);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].score, kMaxExtenderPriority);  // block A, partly used
  EXPECT_LT(p[1].score, p[0].score);            // block B, untouched
  // The domains are measured over the whole ledger, not only the nodes
  // asked about (the busy node fails the filter and is never among them);
  // with it among them the order is the same.
  args->node_names = {bench::H100NodeName(12), bench::H100NodeName(11), bench::H100NodeName(10)};
  p = extender.Prioritize(*args);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_GT(p[1].score, p[0].score);
}

// The domain usage is rebuilt by the extender's own thread once the ledger
// changes, not by a request: Slurm work arriving in block A after the first
// prioritize reaches the scores without any request paying the rebuild.
TEST(ExtenderDomainTest, DomainUsageIsRefreshedInTheBackgroundAfterALedgerChange) {
  Ledger ledger;
  const char* blocks[] = {"A", "A", "B"};
  for (int i = 0; i < 3; ++i) {
    NodeSpec spec = bench::H100Node(10 + i);
    spec.labels["cloud.google.com/gce-topology-block"] = blocks[i];
    ASSERT_TRUE(ledger.UpsertNode(spec).ok());
  }
  NoApi api;
  ExtenderOptions o;
  o.domain_refresh = absl::Milliseconds(1);
  Extender extender(&ledger, nullptr, &api, o);
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(TestdataJson("filter_args.json"));
  ASSERT_TRUE(args.ok());
  args->node_names = {bench::H100NodeName(11), bench::H100NodeName(12)};
  std::vector<HostPriority> p = extender.Prioritize(*args);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].score, p[1].score);  // nothing used anywhere: alike
  testing::HoldSlurm(ledger, bench::H100NodeName(10), 101, 0, 6);
  EXPECT_TRUE(fakes::WaitFor(
      [&] {
        p = extender.Prioritize(*args);
        return p[0].score > p[1].score;
      },
      fakes::kWaitTimeout, "block A's use to reach the scores"));
}

TEST_F(ExtenderTest, OtherPoliciesOrderAsTheyShould) {
  ExtenderOptions packing;
  packing.policy = placement::Policy::kMostAllocated;
  Extender most(&ledger_, nullptr, &api_, packing);
  std::vector<HostPriority> m = most.Prioritize(*ParseExtenderArgs(TestdataJson("filter_args.json")));
  EXPECT_GT(m[3].score, m[4].score);
  EXPECT_GT(m[4].score, m[0].score);

  ExtenderOptions o;
  o.policy = placement::Policy::kLeastAllocated;
  Extender spread(&ledger_, nullptr, &api_, o);
  std::vector<HostPriority> p = spread.Prioritize(*ParseExtenderArgs(TestdataJson("filter_args.json")));
  EXPECT_GT(p[0].score, p[4].score);
  EXPECT_GT(p[4].score, p[3].score);
}

// duet-bridge's configuration: the extender counts the pods it filters in a
// learned workload and scores against it. Here 2-GPU pods make up the
// workload, so a 1-GPU pod stops being packed onto the node where it would
// strand the last GPU.
TEST_F(ExtenderTest, PrioritizeScoresAgainstTheWorkloadItLearns) {
  placement::WorkloadModelOptions mo;
  mo.refresh = absl::ZeroDuration();
  mo.min_arrivals = 10;
  placement::WorkloadModel model(mo);
  ExtenderOptions o;
  o.workload = [&model] { return model.Current(absl::Now()); };
  o.observe = [&model](const std::string& key, const placement::PodRequest& r) {
    model.Observe(key, r, absl::Now());
  };
  Extender learning(&ledger_, nullptr, &api_, o);
  ExtenderArgs one;
  one.pod = PodWith({Container({{"nvidia.com/gpu", "1"}})});
  // 8, 2 and 4 GPUs free.
  one.node_names = {bench::H100NodeName(0), bench::H100NodeName(1), bench::H100NodeName(3)};

  // Nothing learned yet: the pod's own shape, so packing picks the fullest.
  std::vector<HostPriority> before = learning.Prioritize(one);
  EXPECT_EQ(before[1].score, kMaxExtenderPriority);

  // Ten 2-GPU pods pass the filter, each twice (kube-scheduler retries):
  // counted once per UID.
  for (int i = 0; i < 10; ++i) {
    ExtenderArgs two;
    two.pod = PodWith({Container({{"nvidia.com/gpu", "2"}})});
    two.pod["metadata"]["uid"] = absl::StrCat("two-", i);
    two.node_names = one.node_names;
    learning.Filter(two);
    learning.Filter(two);
  }
  const placement::WorkloadModel::Stats st = model.stats(absl::Now());
  EXPECT_EQ(st.arrivals, 10u);
  EXPECT_EQ(st.duplicates, 10u);
  ASSERT_EQ(st.shapes.size(), 1u);
  EXPECT_EQ(st.shapes[0].shape.count, 2u);

  std::vector<HostPriority> after = learning.Prioritize(one);
  EXPECT_EQ(after[2].score, kMaxExtenderPriority);  // 4 free: 3 left, still two 2-GPU pods
  EXPECT_EQ(after[1].score, 0);                     // 2 free: 1 left, no 2-GPU pod fits
  EXPECT_GT(after[0].score, after[1].score);
}

TEST_F(ExtenderTest, PodWithoutDevicesPassesUnknownAndReadyNodes) {
  ExtenderArgs args;
  args.pod = PodWith({Container({{"cpu", "2"}})});
  args.node_names = {"gke-cpu-pool-n2-0", bench::H100NodeName(1), bench::H100NodeName(2)};
  FilterResult r = extender_.Filter(args);
  EXPECT_THAT(r.node_names, ::testing::ElementsAre("gke-cpu-pool-n2-0", bench::H100NodeName(1)));
  EXPECT_EQ(r.failed_unresolvable.count(bench::H100NodeName(2)), 1u);
  for (const HostPriority& h : extender_.Prioritize(args)) EXPECT_EQ(h.score, 0);
}

TEST_F(ExtenderTest, CpuAndMemoryLoadIsHonoured) {
  ExtenderOptions o;
  o.load = [](const NodeView& v) {
    placement::NodeLoad l;
    if (v.spec.name == bench::H100NodeName(0)) l.cpu_milli = 180000;  // 28 of 208 CPUs left
    return l;
  };
  Extender loaded(&ledger_, nullptr, &api_, o);
  FilterResult r = loaded.Filter(*ParseExtenderArgs(TestdataJson("filter_args.json")));
  ASSERT_EQ(r.failed.count(bench::H100NodeName(0)), 1u);
  EXPECT_THAT(r.failed[bench::H100NodeName(0)], HasSubstr("cpu"));
}

TEST_F(ExtenderTest, UnreadablePodFailsEveryNodeWithTheReason) {
  ExtenderArgs args;
  args.pod = PodWith({Container({{"nvidia.com/gpu", "1"}, {"google.com/tpu", "1"}})});
  args.node_names = {bench::H100NodeName(0)};
  FilterResult r = extender_.Filter(args);
  EXPECT_TRUE(r.node_names.empty());
  EXPECT_THAT(r.failed_unresolvable[bench::H100NodeName(0)], HasSubstr("both"));
}

class HandlerTest : public ExtenderTest {
 protected:
  Handler handler_{&extender_, "/duet", false};
};

TEST_F(HandlerTest, FilterOverJsonMatchesTheGolden) {
  HttpReply r = handler_.Handle("POST", "/duet/filter", testing::Testdata("filter_args.json"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(json::parse(r.body), TestdataJson("filter_result.json"));
  r = handler_.Handle("POST", "/duet/prioritize?x=1", testing::Testdata("filter_args.json"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body), TestdataJson("prioritize_result.json"));
}

// Found by tests/fuzz/extender_args_fuzz: nlohmann throws out_of_range, not
// parse_error, for a number beyond a double, and the handler let it escape
// (std::terminate: the extender died on one request).
TEST_F(HandlerTest, NumberOverflowInABodyIsABadRequest) {
  for (const char* verb : {"/duet/filter", "/duet/prioritize", "/duet/bind"}) {
    HttpReply r = handler_.Handle("POST", verb, "1e999");
    EXPECT_EQ(r.status, 400) << verb;
    EXPECT_THAT(r.body, HasSubstr("not valid JSON")) << verb;
    r = handler_.Handle("POST", verb, R"({"Pod":{"a":1e999},"NodeNames":["n"]})");
    EXPECT_EQ(r.status, 400) << verb;
  }
}

TEST_F(HandlerTest, BadRequestsAreRefusedAndChangeNothing) {
  const uint64_t seq = ledger_.seq();
  HttpReply r = handler_.Handle("POST", "/duet/filter", "{\"Pod\": ");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("not valid JSON"));
  r = handler_.Handle("POST", "/duet/filter", "[1,2]");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("must be a JSON object"));
  r = handler_.Handle("POST", "/duet/bind", R"({"PodName":"p","PodNamespace":"ns"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("ExtenderBindingArgs.Node: must be set"));
  r = handler_.Handle("POST", "/duet/preempt", "{}");
  EXPECT_EQ(r.status, 404);
  r = handler_.Handle("POST", "/other/filter", "{}");
  EXPECT_EQ(r.status, 404);
  r = handler_.Handle("GET", "/duet/filter", "");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.allow, "POST");
  r = handler_.Handle("POST", "/duet/_echo", "x");
  EXPECT_EQ(r.status, 404);  // only with enable_echo
  EXPECT_EQ(handler_.Handle("GET", "/healthz", "").status, 200);
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

TEST_F(HandlerTest, BindRefusalIsAnErrorInTheResult) {
  HttpReply r = handler_.Handle(
      "POST", "/duet/bind",
      R"({"PodName":"p","PodNamespace":"ns","PodUID":"u1","Node":"gke-a3-highgpu-pool-0"})");
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(json::parse(r.body)["Error"].get<std::string>(), HasSubstr("no API server"));
}


// docs/gangs.md 5: a single TPU pod never takes part of a multi-host slice;
// a single-host TPU node of the same topology is any pod's.
TEST(ExtenderSliceTest, ASingleTpuPodIsRefusedOnAMultiHostSlicesHosts) {
  Ledger ledger;
  auto tpu_node = [&](const std::string& name, const std::string& pool, uint32_t chips) {
    NodeSpec n;
    n.name = name;
    n.pool = pool;
    n.cpus = 64;
    n.memory_mib = 256 * 1024;
    for (uint32_t i = 0; i < chips; ++i) {
      DeviceSpec d;
      d.kind = DeviceKind::kTpu;
      d.index = i;
      d.model = "tpu-v5-lite-podslice";
      d.topology.tpu_topology = "2x4";
      n.devices.push_back(d);
    }
    ASSERT_TRUE(ledger.UpsertNode(n).ok());
  };
  tpu_node("slice-a-0", "slice-a", 4);  // one of 2 hosts of a 2x4 slice
  tpu_node("single-0", "single", 8);    // a whole 2x4 slice on one host
  NoApi api;
  Extender extender{&ledger, nullptr, &api, ExtenderOptions{}};
  ExtenderArgs args;
  args.pod = PodWith({Container({{"google.com/tpu", "4"}})});
  args.node_names = {"slice-a-0", "single-0"};
  FilterResult r = extender.Filter(args);
  EXPECT_THAT(r.node_names, ::testing::ElementsAre("single-0"));
  EXPECT_THAT(r.failed_unresolvable["slice-a-0"],
              HasSubstr("TPU_SLICE_WHOLE: node slice-a-0 is one of the 2 hosts of multi-host TPU "
                        "slice slice-a (2x4)"));
  // A pod that asks no TPU is not concerned.
  args.pod = PodWith({Container({{"cpu", "1"}})});
  EXPECT_THAT(extender.Filter(args).node_names, ::testing::ElementsAre("slice-a-0", "single-0"));
}

// ---------------------------------------------------------------- prioritize's fast path

// A small deterministic generator (SplitMix64), so the clusters and pods,
// and with them the digest below, are the same on every standard library.
class Rand {
 public:
  explicit Rand(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(Next() % n); }

 private:
  uint64_t s_;
};

uint64_t Fnv1a(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// 40 nodes: H100s and L4s, some cordoned, some with CPU/memory untracked,
// whole GPUs and shares held at random.
void BuildRandomCluster(Ledger& ledger, Rand& rnd) {
  for (int i = 0; i < 40; ++i) {
    NodeSpec spec = bench::H100Node(i);
    if (rnd.Below(5) == 0) {
      for (DeviceSpec& d : spec.devices) d.model = "nvidia-l4";
    }
    if (rnd.Below(10) == 0) spec.state = NodeState::kCordoned;
    if (rnd.Below(6) == 0) spec.cpus = 0;
    if (rnd.Below(6) == 0) spec.memory_mib = 0;
    ASSERT_TRUE(ledger.UpsertNode(spec).ok());
    HoldRequest h;
    h.node = spec.name;
    h.owner = Owner::SlurmJob(static_cast<uint32_t>(500 + i));
    for (uint32_t g = 0; g < 8; ++g) {
      const uint32_t r = rnd.Below(4);
      if (r == 0) h.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
      if (r == 1) h.devices.push_back({DeviceKind::kGpu, g, 100 * (1 + rnd.Below(9))});
    }
    if (!h.devices.empty()) {
      ASSERT_TRUE(ledger.Hold(h).ok());
    }
  }
}

// A pod asking for 0..8 GPUs, sometimes a share, sometimes of a model, with
// CPU and memory; every one with the same uid and resourceVersion, so a cache
// keyed by those would answer wrongly.
json RandomPod(Rand& rnd) {
  json requests = {{"nvidia.com/gpu", std::to_string(rnd.Below(9))},
                   {"cpu", std::to_string(rnd.Below(120))},
                   {"memory", absl::StrCat(rnd.Below(900), "Gi")}};
  json pod = PodWith({Container(requests)});
  pod["metadata"]["resourceVersion"] = "7";
  json annotations = json::object();
  if (rnd.Below(3) == 0) annotations[kDeviceMilliAnnotation] = std::to_string(100 * (1 + rnd.Below(9)));
  const uint32_t m = rnd.Below(4);
  if (m == 0) annotations[kModelsAnnotation] = "nvidia-l4";
  if (m == 1) annotations[kModelsAnnotation] = "nvidia-h100-80gb,nvidia-l4";
  if (!annotations.empty()) pod["metadata"]["annotations"] = annotations;
  return pod;
}

// The server's prioritize (names as views, the pod's request cached from the
// filter, the reply written directly) answers byte for byte what the DOM
// path (ParseExtenderArgs, Extender::Prioritize, PriorityListJson) answers,
// for random clusters and pods under every policy, with a load and with a
// workload; and those answers are the ones main's scoring gives (the digest,
// recorded with main's bridge/placement before PickBestFit's sort changed:
// it fails if any score of the 150 replies moves).
TEST(PrioritizeFastPathTest, RepliesEqualTheDomPathsForRandomClustersAndPods) {
  auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  Rand rnd(28);
  Ledger ledger;
  BuildRandomCluster(ledger, rnd);
  NoApi api;
  placement::PodRequest shape;
  shape.kind = DeviceKind::kGpu;
  shape.count = 2;
  shape.cpu_milli = 16000;
  const auto workload = std::make_shared<const placement::Workload>(
      std::vector<placement::Workload::Shape>{{shape, 1.0}});
  std::vector<ExtenderOptions> configs;
  for (placement::Policy p : {placement::Policy::kDuet, placement::Policy::kFgd,
                              placement::Policy::kBestFit, placement::Policy::kLeastAllocated,
                              placement::Policy::kMostAllocated}) {
    ExtenderOptions o;
    o.policy = p;
    configs.push_back(o);
  }
  configs[0].load = [](const NodeView& v) {
    placement::NodeLoad l;
    l.cpu_milli = 1000 * (v.spec.name.size() % 7) * 9;
    l.memory_mib = 1024 * (v.spec.name.back() % 5);
    return l;
  };
  ExtenderOptions with_workload;
  with_workload.workload = [workload] { return workload; };
  configs.push_back(with_workload);

  uint64_t digest = 0xcbf29ce484222325ULL;
  int compared = 0;
  for (ExtenderOptions& o : configs) {
    Extender extender(&ledger, nullptr, &api, o);
    Handler handler(&extender, "/duet", false);
    for (int k = 0; k < 25; ++k) {
      const json pod = RandomPod(rnd);
      json names = json::array();
      for (int n = 0; n < 40; ++n) {
        if (rnd.Below(3) != 0) names.push_back(bench::H100NodeName(n));
      }
      names.push_back("gke-cpu-pool-n2-0");  // not in the ledger
      names.push_back(names[0]);             // a name twice
      const std::string body = json{{"Pod", pod}, {"NodeNames", names}}.dump();
      SCOPED_TRACE(body.substr(0, 400));
      absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(json::parse(body));
      ASSERT_TRUE(args.ok()) << args.status();
      const std::string want = dump(PriorityListJson(extender.Prioritize(*args)));
      // A pod not seen before: the handler parses it.
      HttpReply cold = handler.Handle("POST", "/duet/prioritize", body);
      ASSERT_EQ(cold.status, 200) << cold.body;
      EXPECT_EQ(cold.body, want);
      // After its filter, from the cache.
      const uint64_t hits = extender.pod_request_cache_hits();
      ASSERT_EQ(handler.Handle("POST", "/duet/filter", body).status, 200);
      HttpReply hot = handler.Handle("POST", "/duet/prioritize", body);
      ASSERT_EQ(hot.status, 200) << hot.body;
      EXPECT_EQ(hot.body, want);
      EXPECT_EQ(extender.pod_request_cache_hits(), hits + 2);  // the filter's and prioritize's
      digest = Fnv1a(digest, want);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 150);
  EXPECT_EQ(digest, 0x75baa095ed0b7cd0ULL) << std::hex << "digest 0x" << digest;
}

// The cache answers only for the same bytes: a pod that differs in its
// resources alone (same uid, same resourceVersion) is read anew.
TEST_F(HandlerTest, PrioritizeReadsAPodThatDiffersFromTheCachedOneAnew) {
  json pod = PodWith({Container({{"nvidia.com/gpu", "4"}})});
  pod["metadata"]["resourceVersion"] = "9";
  json names = json::array();
  for (int i = 0; i < 6; ++i) names.push_back(bench::H100NodeName(i));
  const std::string four = json{{"Pod", pod}, {"NodeNames", names}}.dump();
  pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "6";
  const std::string six = json{{"Pod", pod}, {"NodeNames", names}}.dump();
  ASSERT_EQ(handler_.Handle("POST", "/duet/filter", four).status, 200);
  const HttpReply r4 = handler_.Handle("POST", "/duet/prioritize", four);
  const HttpReply r6 = handler_.Handle("POST", "/duet/prioritize", six);
  const json j4 = json::parse(r4.body);
  const json j6 = json::parse(r6.body);
  // pool-3 (4 free) is best for four GPUs; six fit only on the empty pool-0.
  EXPECT_EQ(j4[3]["Score"], kMaxExtenderPriority);
  EXPECT_EQ(j6[3]["Score"], 0);
  EXPECT_EQ(j6[0]["Score"], kMaxExtenderPriority);
}

// A cached request names a model no node had when it was read (id 0); a node
// of that model added afterwards is accepted, as a fresh read would.
TEST_F(HandlerTest, ACachedRequestSeesAModelThatArrivedAfterIt) {
  const std::string model = "duet-test-prioritize-cache-model";
  ASSERT_EQ(FindModelId(model), 0u);
  json pod = PodWith({Container({{"nvidia.com/gpu", "1"}})});
  pod["metadata"]["annotations"] = {{kModelsAnnotation, model}};
  const std::string body =
      json{{"Pod", pod}, {"NodeNames", {bench::H100NodeName(0), "gke-new-model-0"}}}.dump();
  HttpReply f = handler_.Handle("POST", "/duet/filter", body);
  ASSERT_EQ(f.status, 200);
  EXPECT_THAT(json::parse(f.body)["NodeNames"], ::testing::IsEmpty());
  NodeSpec spec = bench::H100Node(100);
  spec.name = "gke-new-model-0";
  for (DeviceSpec& d : spec.devices) d.model = model;
  ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
  const uint64_t hits = extender_.pod_request_cache_hits();
  HttpReply p = handler_.Handle("POST", "/duet/prioritize", body);
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(extender_.pod_request_cache_hits(), hits + 1);
  EXPECT_EQ(p.body, R"([{"Host":"gke-a3-highgpu-pool-0","Score":0},{"Host":"gke-new-model-0","Score":10}])");
}

// The names as views: the same names, escapes included, as the DOM path;
// the same bodies declined.
TEST(ExtenderArgsTest, PrioritizeFastPathReadsTheSameNames) {
  const json golden = TestdataJson("filter_args.json");
  for (const std::string& body :
       {golden.dump(), golden.dump(2),
        json{{"NodeNames", {"a", "b\u00e9\"q", ""}}, {"Pod", PodWith({Container({})})}}.dump()}) {
    std::optional<PrioritizeArgs> fast = ParsePrioritizeArgsFast(body);
    std::optional<ExtenderArgs> full = ParseExtenderArgsFast(body);
    ASSERT_TRUE(fast.has_value());
    ASSERT_TRUE(full.has_value());
    PrioritizeArgs moved = std::move(*fast);  // the views survive a move
    EXPECT_EQ(std::vector<std::string>(moved.node_names.begin(), moved.node_names.end()),
              full->node_names);
    EXPECT_EQ(moved.pod_text, full->pod_text);
    std::optional<json> pod = ParsePodText(moved.pod_text);
    ASSERT_TRUE(pod.has_value());
    EXPECT_EQ(*pod, full->pod);
  }
  EXPECT_FALSE(ParsePrioritizeArgsFast(R"({"Pod":{},"NodeNames":["a",3]})").has_value());
  EXPECT_FALSE(ParsePrioritizeArgsFast(R"({"Pod":{},"NodeNames":["a"],"X":1})").has_value());
  // Accepted (the pod is only skipped), but its text does not parse.
  std::optional<PrioritizeArgs> bad = ParsePrioritizeArgsFast(R"({"Pod":{"a":1e999},"NodeNames":["n"]})");
  ASSERT_TRUE(bad.has_value());
  EXPECT_FALSE(ParsePodText(bad->pod_text).has_value());
  // Names and scores as views: the same bytes as nlohmann's.
  auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  std::vector<HostPriority> list = {{"a", 10}, {"b\"", 0}, {"c", -3}, {"\xc3\xa9t\xe9", 7}};
  EXPECT_EQ(PriorityListBodyOfViews(std::vector<std::string_view>{"a", "b\"", "c", "\xc3\xa9t\xe9"},
                             {10, 0, -3, 7}),
            dump(PriorityListJson(list)));
  EXPECT_EQ(PriorityListBodyOfViews(std::vector<std::string_view>{"a", "b"},
                             {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}),
            dump(PriorityListJson({{"a", std::numeric_limits<int64_t>::min()},
                                   {"b", std::numeric_limits<int64_t>::max()}})));
}

}  // namespace
}  // namespace extender
}  // namespace duet
