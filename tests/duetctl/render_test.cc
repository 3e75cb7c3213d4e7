#include "duetctl/render.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"

namespace duet::ctl {
namespace {

using ::google::protobuf::util::TimeUtil;
using ::testing::HasSubstr;

v1::Owner Job(uint32_t job) {
  v1::Owner o;
  o.mutable_slurm_job()->set_job_id(job);
  return o;
}
v1::Owner Step(uint32_t job, uint32_t step) {
  v1::Owner o;
  o.mutable_slurm_step()->set_job_id(job);
  o.mutable_slurm_step()->set_step_id(step);
  return o;
}
v1::Owner Pod(const std::string& uid, const std::string& ns, const std::string& name) {
  v1::Owner o;
  o.mutable_pod()->set_uid(uid);
  o.mutable_pod()->set_namespace_(ns);
  o.mutable_pod()->set_name(name);
  return o;
}
v1::Owner Placeholder(uint32_t job, const std::string& uid) {
  v1::Owner o;
  o.mutable_placeholder()->set_job_id(job);
  o.mutable_placeholder()->set_pod_uid(uid);
  return o;
}

v1::Device* AddDevice(v1::Node* node, v1::DeviceKind kind, uint32_t index,
                      const std::string& model) {
  v1::Device* d = node->add_devices();
  d->set_kind(kind);
  d->set_index(index);
  d->set_id(absl::StrCat(kind == v1::DEVICE_KIND_GPU ? "GPU-" : "TPU-", index));
  d->set_model(model);
  d->set_capacity_milli(1000);
  return d;
}

void AddHolder(v1::Device* d, const v1::Owner& owner, uint32_t milli) {
  v1::DeviceHolder* h = d->add_holders();
  *h->mutable_owner() = owner;
  h->set_milli(milli);
  d->set_used_milli(std::min<uint32_t>(1000, d->used_milli() + milli));
}

// gke-a: 4 H100s. gpu0 held by job 12 and its step 0 (one group: counts
// once), gpu1 by pod ml/train, gpu2 half by pod ml/infer, gpu3 free.
v1::Node GpuNode() {
  v1::Node n;
  n.set_name("gke-a");
  n.set_state(v1::NODE_STATE_READY);
  n.set_pool("gpu-pool");
  n.set_zone("us-central1-a");
  n.set_cpus(96);
  n.set_memory_mib(1024);
  n.set_generation(7);
  AddHolder(AddDevice(&n, v1::DEVICE_KIND_GPU, 0, "nvidia-h100-80gb"), Job(12), 1000);
  AddHolder(n.mutable_devices(0), Step(12, 0), 1000);
  AddHolder(AddDevice(&n, v1::DEVICE_KIND_GPU, 1, "nvidia-h100-80gb"),
            Pod("uid-train", "ml", "train"), 1000);
  AddHolder(AddDevice(&n, v1::DEVICE_KIND_GPU, 2, "nvidia-h100-80gb"),
            Pod("uid-infer", "ml", "infer"), 500);
  AddDevice(&n, v1::DEVICE_KIND_GPU, 3, "nvidia-h100-80gb");
  return n;
}

// gke-b: cordoned, 4 TPU chips; tpu0-1 held by pod web and its placeholder.
v1::Node TpuNode() {
  v1::Node n;
  n.set_name("gke-b");
  n.set_state(v1::NODE_STATE_CORDONED);
  n.set_generation(3);
  for (uint32_t i = 0; i < 4; ++i) {
    v1::Device* d = AddDevice(&n, v1::DEVICE_KIND_TPU, i, "tpu-v5-lite-podslice");
    if (i < 2) {
      AddHolder(d, Placeholder(7, "0a1b2c3d-4e5f-6789"), 1000);
      AddHolder(d, Pod("0a1b2c3d-4e5f-6789", "default", "web"), 1000);
    }
  }
  return n;
}

v1::ListNodesResponse TwoNodes() {
  v1::ListNodesResponse r;
  *r.add_nodes() = TpuNode();  // out of order: the table sorts by name
  *r.add_nodes() = GpuNode();
  return r;
}

TEST(RenderNodesTable, CountsSlurmPodsSharesAndFreePerModel) {
  EXPECT_EQ(RenderNodesTable(TwoNodes()),
            "NODE    STATE      KIND   MODEL                  TOTAL   SLURM   PODS   FREE\n"
            "gke-a   Ready      gpu    nvidia-h100-80gb       4       1       1.5    1.5\n"
            "gke-b   Cordoned   tpu    tpu-v5-lite-podslice   4       0       2      2\n"
            "2 nodes; gpu: 4 total, 1 slurm, 1.5 pods, 1.5 free; "
            "tpu: 4 total, 0 slurm, 2 pods, 2 free\n");
}

TEST(RenderNodesTable, EmptyAnswerSaysSo) {
  EXPECT_EQ(RenderNodesTable(v1::ListNodesResponse()), "No nodes.\n");
}

TEST(RenderNodesTable, NodeWithoutDevicesGetsOneRow) {
  v1::ListNodesResponse r;
  r.add_nodes()->set_name("cpu-only");
  EXPECT_EQ(RenderNodesTable(r),
            "NODE       STATE     KIND   MODEL   TOTAL   SLURM   PODS   FREE\n"
            "cpu-only   Unknown   -      -       0       0       0      0\n"
            "1 node\n");
}

TEST(TallyNodes, SharesOfDifferentGroupsAddUpAndOneModelPerRow) {
  v1::ListNodesResponse r;
  v1::Node* n = r.add_nodes();
  n->set_name("n");
  v1::Device* d0 = AddDevice(n, v1::DEVICE_KIND_GPU, 0, "a100");
  AddHolder(d0, Pod("p1", "ns", "one"), 500);
  AddHolder(d0, Pod("p2", "ns", "two"), 500);  // two pods: one whole device
  v1::Device* d1 = AddDevice(n, v1::DEVICE_KIND_GPU, 1, "a100");
  AddHolder(d1, Step(3, 1), 250);
  AddHolder(d1, Pod("p3", "ns", "three"), 500);
  AddDevice(n, v1::DEVICE_KIND_GPU, 2, "l4");
  const auto rows = TallyNodes(r.nodes());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].model, "a100");
  EXPECT_EQ(rows[0].total, 2000);
  EXPECT_EQ(rows[0].slurm, 250);
  EXPECT_EQ(rows[0].pods, 1500);
  EXPECT_EQ(rows[0].free, 250);
  EXPECT_EQ(rows[1].model, "l4");
  EXPECT_EQ(rows[1].total, 1000);
  EXPECT_EQ(rows[1].free, 1000);
}

TEST(TallyNodes, OverReportedHoldersNeverGiveNegativeFree) {
  v1::ListNodesResponse r;
  v1::Device* d = AddDevice(r.add_nodes(), v1::DEVICE_KIND_GPU, 0, "m");
  AddHolder(d, Job(1), 1000);
  AddHolder(d, Pod("p", "ns", "n"), 1000);  // broken answer: two groups
  const auto rows = TallyNodes(r.nodes());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].slurm, 1000);
  EXPECT_EQ(rows[0].pods, 0);
  EXPECT_EQ(rows[0].free, 0);
}

TEST(RenderHoldsTable, OwnersDevicesAndAges) {
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  v1::ListHoldingsResponse r;
  auto add = [&](const std::string& node, const v1::Owner& owner, absl::Duration age,
                 std::vector<std::pair<uint32_t, uint32_t>> devices, v1::DeviceKind kind) {
    v1::Holding* h = r.add_holdings();
    h->set_node(node);
    *h->mutable_owner() = owner;
    for (auto [index, milli] : devices) {
      v1::HeldDevice* d = h->add_devices();
      d->set_kind(kind);
      d->set_index(index);
      d->set_milli(milli);
    }
    *h->mutable_granted_at() =
        TimeUtil::SecondsToTimestamp(absl::ToUnixSeconds(now - age));
  };
  add("gke-b", Placeholder(7, "0a1b2c3d-4e5f-6789"), absl::Hours(26),
      {{0, 1000}, {1, 1000}}, v1::DEVICE_KIND_TPU);
  add("gke-a", Step(12, 0), absl::Minutes(5) + absl::Seconds(3),
      {{0, 1000}, {1, 1000}, {2, 1000}, {3, 1000}}, v1::DEVICE_KIND_GPU);
  add("gke-a", Pod("uid-infer", "ml", "infer"), absl::Seconds(9), {{5, 500}},
      v1::DEVICE_KIND_GPU);
  add("gke-b", Pod("0a1b2c3d-4e5f-6789", "default", "web"), absl::Hours(2) + absl::Minutes(4),
      {{0, 1000}, {1, 1000}}, v1::DEVICE_KIND_TPU);
  add("gke-c", Placeholder(8, "ffffeeeeddddcccc"), absl::Seconds(-3), {{0, 1000}, {2, 0}},
      v1::DEVICE_KIND_GPU);
  EXPECT_EQ(RenderHoldsTable(r, now),
            "NODE    OWNER                                   DEVICES     SINCE\n"
            "gke-a   job 12 step 0                           gpu0-3      5m3s\n"
            "gke-a   pod ml/infer                            gpu5@500m   9s\n"
            "gke-b   placeholder job 7 (pod default/web)     tpu0-1      1d2h\n"
            "gke-b   pod default/web                         tpu0-1      2h4m\n"
            "gke-c   placeholder job 8 (pod uid ffffeeee\u2026)   gpu0,gpu2   0s\n");
}

TEST(RenderHoldsTable, EmptyAnswerSaysSo) {
  EXPECT_EQ(RenderHoldsTable(v1::ListHoldingsResponse(), absl::Now()), "No holdings.\n");
}

TEST(RenderNodeDetail, EveryDeviceWithItsHolders) {
  EXPECT_EQ(RenderNodeDetail(GpuNode()),
            "Name:         gke-a\n"
            "State:        Ready\n"
            "Pool:         gpu-pool\n"
            "Zone:         us-central1-a\n"
            "CPUs:         96\n"
            "Memory:       1024 MiB\n"
            "Generation:   7\n"
            "\n"
            "KIND   INDEX   ID      MODEL              USED    HOLDERS\n"
            "gpu    0       GPU-0   nvidia-h100-80gb   1000m   job 12, job 12 step 0\n"
            "gpu    1       GPU-1   nvidia-h100-80gb   1000m   pod ml/train\n"
            "gpu    2       GPU-2   nvidia-h100-80gb   500m    pod ml/infer (500m)\n"
            "gpu    3       GPU-3   nvidia-h100-80gb   0m      -\n");
}

TEST(OwnerText, EveryOwnerKind) {
  EXPECT_EQ(OwnerText(Job(12)), "job 12");
  EXPECT_EQ(OwnerText(Step(12, 0)), "job 12 step 0");
  EXPECT_EQ(OwnerText(Step(12, 0xfffffffb)), "job 12 step batch");
  EXPECT_EQ(OwnerText(Step(12, 0xfffffffc)), "job 12 step extern");
  EXPECT_EQ(OwnerText(Pod("u", "ns", "name")), "pod ns/name");
  EXPECT_EQ(OwnerText(Pod("u", "", "name")), "pod name");
  EXPECT_EQ(OwnerText(Pod("1234567890", "", "")), "pod uid 12345678\u2026");
  EXPECT_EQ(OwnerText(Placeholder(7, "abc")), "placeholder job 7 (pod uid abc)");
  EXPECT_EQ(OwnerText(Placeholder(7, "abc"), "ns/web"), "placeholder job 7 (pod ns/web)");
  v1::Owner claim;
  claim.mutable_claim()->set_job_id(9);
  claim.mutable_claim()->set_uid("1234567890");
  EXPECT_EQ(OwnerText(claim), "claim uid 12345678\u2026 (lend job 9)");
  claim.mutable_claim()->set_namespace_("ns");
  claim.mutable_claim()->set_name("c");
  EXPECT_EQ(OwnerText(claim), "claim ns/c (lend job 9)");
  v1::Owner lend;
  lend.mutable_lend()->set_job_id(9);
  lend.mutable_lend()->set_node("gke-a");
  EXPECT_EQ(OwnerText(lend), "lent to kubernetes (lend job 9)");
  EXPECT_EQ(OwnerText(v1::Owner()), "unknown owner");
}

TEST(DevicesText, RangesAndShares) {
  auto held = [](std::vector<std::tuple<v1::DeviceKind, uint32_t, uint32_t>> ds) {
    google::protobuf::RepeatedPtrField<v1::HeldDevice> out;
    for (auto [kind, index, milli] : ds) {
      v1::HeldDevice* d = out.Add();
      d->set_kind(kind);
      d->set_index(index);
      d->set_milli(milli);
    }
    return out;
  };
  constexpr auto G = v1::DEVICE_KIND_GPU;
  constexpr auto T = v1::DEVICE_KIND_TPU;
  EXPECT_EQ(DevicesText(held({{G, 3, 1000}, {G, 1, 1000}, {G, 0, 1000}, {G, 2, 1000}})), "gpu0-3");
  EXPECT_EQ(DevicesText(held({{G, 0, 1000}, {G, 2, 1000}})), "gpu0,gpu2");
  EXPECT_EQ(DevicesText(held({{G, 2, 500}})), "gpu2@500m");
  EXPECT_EQ(DevicesText(held({{G, 0, 0}, {G, 1, 250}, {G, 2, 1000}})), "gpu0,gpu1@250m,gpu2");
  EXPECT_EQ(DevicesText(held({{T, 0, 1000}, {T, 1, 1000}, {G, 4, 1000}})), "gpu4,tpu0-1");
  EXPECT_EQ(DevicesText(held({})), "-");
}

TEST(MilliDevices, DecimalsOnlyWhereNeeded) {
  EXPECT_EQ(MilliDevices(0), "0");
  EXPECT_EQ(MilliDevices(2000), "2");
  EXPECT_EQ(MilliDevices(500), "0.5");
  EXPECT_EQ(MilliDevices(1250), "1.25");
  EXPECT_EQ(MilliDevices(1005), "1.005");
  EXPECT_EQ(MilliDevices(-1500), "-1.5");
}

TEST(AgeText, Units) {
  EXPECT_EQ(AgeText(absl::Seconds(0)), "0s");
  EXPECT_EQ(AgeText(absl::Seconds(59)), "59s");
  EXPECT_EQ(AgeText(absl::Seconds(303)), "5m3s");
  EXPECT_EQ(AgeText(absl::Hours(2) + absl::Minutes(4) + absl::Seconds(59)), "2h4m");
  EXPECT_EQ(AgeText(absl::Hours(74)), "3d2h");
  EXPECT_EQ(AgeText(absl::Seconds(-5)), "0s");
}

TEST(NodesJson, DocumentedShape) {
  const Json j = NodesJson(TwoNodes());
  ASSERT_EQ(j["nodes"].size(), 2u);
  const Json& a = j["nodes"][0];
  EXPECT_EQ(a.begin().key(), "name");  // keys in documented order
  EXPECT_EQ(a["name"], "gke-a");
  EXPECT_EQ(a["state"], "ready");
  EXPECT_EQ(a["pool"], "gpu-pool");
  EXPECT_EQ(a["generation"], 7);
  ASSERT_EQ(a["models"].size(), 1u);
  const Json& m = a["models"][0];
  EXPECT_EQ(m["kind"], "gpu");
  EXPECT_EQ(m["model"], "nvidia-h100-80gb");
  EXPECT_TRUE(m["total"].is_number_integer());
  EXPECT_EQ(m["total"], 4);
  EXPECT_EQ(m["slurm"], 1);
  EXPECT_TRUE(m["pods"].is_number_float());
  EXPECT_DOUBLE_EQ(m["pods"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(m["free"].get<double>(), 1.5);
  EXPECT_EQ(j["nodes"][1]["state"], "cordoned");
  EXPECT_EQ(j["summary"]["nodes"], 2);
  ASSERT_EQ(j["summary"]["kinds"].size(), 2u);
  EXPECT_EQ(j["summary"]["kinds"][1]["kind"], "tpu");
  EXPECT_EQ(j["summary"]["kinds"][1]["pods"], 2);
  // Compact form is what --watch --json prints, one line per update.
  EXPECT_THAT(j.dump(), HasSubstr(R"("models":[{"kind":"gpu","model":"nvidia-h100-80gb",)"
                                  R"("total":4,"slurm":1,"pods":1.5,"free":1.5}])"));
}

TEST(HoldsJson, DocumentedShape) {
  v1::ListHoldingsResponse r;
  v1::Holding* h = r.add_holdings();
  h->set_node("gke-b");
  *h->mutable_owner() = Placeholder(7, "uid-web");
  v1::HeldDevice* d = h->add_devices();
  d->set_kind(v1::DEVICE_KIND_TPU);
  d->set_index(1);
  d->set_id("TPU-1");
  *h->mutable_granted_at() = TimeUtil::SecondsToTimestamp(1700000000);
  h->set_generation(4);
  v1::Holding* p = r.add_holdings();
  p->set_node("gke-b");
  *p->mutable_owner() = Pod("uid-web", "default", "web");

  const Json j = HoldsJson(r);
  ASSERT_EQ(j["holdings"].size(), 2u);
  const Json& a = j["holdings"][0];
  EXPECT_EQ(a["node"], "gke-b");
  EXPECT_EQ(a["owner"], Json::parse(R"({"kind":"placeholder","job_id":7,"pod_uid":"uid-web"})"));
  EXPECT_EQ(a["owner_text"], "placeholder job 7 (pod default/web)");
  EXPECT_EQ(a["holder"], "pods");
  EXPECT_EQ(a["devices"], Json::parse(R"([{"kind":"tpu","index":1,"id":"TPU-1","milli":1000}])"));
  EXPECT_EQ(a["granted_at"], "2023-11-14T22:13:20Z");
  EXPECT_EQ(a["generation"], 4);
  EXPECT_EQ(j["holdings"][1]["owner"],
            Json::parse(R"({"kind":"pod","uid":"uid-web","namespace":"default","name":"web"})"));
  EXPECT_TRUE(j["holdings"][1]["granted_at"].is_null());
}

TEST(NodeJson, DocumentedShape) {
  v1::Node n = GpuNode();
  (*n.mutable_labels())["b"] = "2";
  (*n.mutable_labels())["a"] = "1";
  n.mutable_devices(0)->mutable_topology()->set_nvlink_domain("clique-1");
  const Json j = NodeJson(n);
  EXPECT_EQ(j["name"], "gke-a");
  EXPECT_EQ(j["cpus"], 96);
  EXPECT_EQ(j["memory_mib"], 1024);
  EXPECT_EQ(j["labels"].dump(), R"({"a":"1","b":"2"})");
  ASSERT_EQ(j["devices"].size(), 4u);
  const Json& d0 = j["devices"][0];
  EXPECT_EQ(d0["id"], "GPU-0");
  EXPECT_EQ(d0["capacity_milli"], 1000);
  EXPECT_EQ(d0["used_milli"], 1000);
  EXPECT_EQ(d0["topology"].dump(), R"({"nvlink_domain":"clique-1"})");
  ASSERT_EQ(d0["holders"].size(), 2u);
  EXPECT_EQ(d0["holders"][1]["owner"],
            Json::parse(R"({"kind":"slurm_step","job_id":12,"step_id":0})"));
  EXPECT_EQ(d0["holders"][1]["holder"], "slurm");
  EXPECT_EQ(j["devices"][2]["holders"][0]["milli"], 500);
  EXPECT_EQ(j["devices"][3]["holders"], Json::array());
}

}  // namespace
}  // namespace duet::ctl

namespace duet::ctl {
namespace {

v1::WorkloadResponse TwoShapes() {
  v1::WorkloadResponse r;
  v1::WorkloadShape* a = r.add_shapes();
  a->set_kind(v1::DEVICE_KIND_GPU);
  a->set_count(1);
  a->set_milli(500);
  a->set_cpu_milli(4000);
  a->set_weight(6);
  a->set_share(0.6);
  v1::WorkloadShape* b = r.add_shapes();
  b->set_kind(v1::DEVICE_KIND_GPU);
  b->set_count(8);
  b->set_milli(1000);
  b->add_models("nvidia-h100-80gb");
  b->set_cpu_milli(96000);
  b->set_memory_mib(1 << 20);
  b->set_weight(3);
  b->set_share(0.3);
  r.set_tracked(5);
  r.set_coverage(0.9);
  r.set_total_weight(10);
  r.set_arrivals(12);
  r.set_duplicates(4);
  r.set_evictions(0);
  r.set_half_life("6h");
  return r;
}

TEST(RenderWorkloadTable, ShapesHeaviestFirstWithASummary) {
  const std::string out = RenderWorkloadTable(TwoShapes());
  EXPECT_THAT(out, HasSubstr("2 shapes exported of 5 tracked, covering 90.0% of 10.0 arrivals "
                             "(half-life 6h; 12 counted, 4 seen again, 0 shapes dropped)."));
  EXPECT_THAT(out, HasSubstr("SHARE"));
  const size_t first = out.find("60.0%");
  const size_t second = out.find("30.0%");
  ASSERT_NE(first, std::string::npos);
  ASSERT_NE(second, std::string::npos);
  EXPECT_LT(first, second);
  EXPECT_THAT(out, HasSubstr("500m"));
  EXPECT_THAT(out, HasSubstr("nvidia-h100-80gb"));
  EXPECT_THAT(out, HasSubstr("1048576Mi"));
  EXPECT_THAT(RenderWorkloadTable(v1::WorkloadResponse()), HasSubstr("No shapes learned yet."));
}

TEST(WorkloadJson, EveryField) {
  const Json j = WorkloadJson(TwoShapes());
  ASSERT_EQ(j["shapes"].size(), 2u);
  EXPECT_EQ(j["shapes"][0]["kind"], "gpu");
  EXPECT_EQ(j["shapes"][0]["milli"], 500);
  EXPECT_EQ(j["shapes"][1]["models"], Json::array({"nvidia-h100-80gb"}));
  EXPECT_EQ(j["tracked"], 5);
  EXPECT_EQ(j["half_life"], "6h");
  EXPECT_DOUBLE_EQ(j["coverage"].get<double>(), 0.9);
}

// Issue 25, item 1: a pod namespace holding a newline and an ANSI escape was
// journaled, then printed raw to the operator's terminal by `duetctl holds`.
// Names from the ledger are printed escaped: one row per holding, the escape
// visible, no byte a terminal acts on.
TEST(Printable, EscapesWhatATerminalActsOnAndKeepsPrintableUtf8) {
  EXPECT_EQ(Printable("gke-a"), "gke-a");
  EXPECT_EQ(Printable("ml\n\x1b[31m"), "ml\\n\\x1b[31m");
  EXPECT_EQ(Printable("a\rb\tc\\d\x7f" + std::string(1, '\0')), "a\\rb\\tc\\\\d\\x7f\\x00");
  // Printable UTF-8 stays; C1 controls (CSI as 0xc2 0x9b), bidi overrides
  // and zero-width characters are escaped; bytes that are not UTF-8 too.
  EXPECT_EQ(Printable("caf\u00e9 \u2026"), "caf\u00e9 \u2026");
  EXPECT_EQ(Printable("x\u009b31my"), "x\\u009b31my");
  EXPECT_EQ(Printable("evil\u202etxt.exe"), "evil\\u202etxt.exe");
  EXPECT_EQ(Printable("a\u200bb\u2028c"), "a\\u200bb\\u2028c");
  EXPECT_EQ(Printable("\xff\xc0\x80\xe2\x80"), "\\xff\\xc0\\x80\\xe2\\x80");
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
}

// Whether `text` holds a byte a terminal acts on: C0 controls, DEL, or the
// lead of a C1 control.
bool HasControlBytes(const std::string& text, bool allow_newline) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n' && allow_newline) continue;
    if (c < 0x20 || c == 0x7f) return true;
    if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      return true;
    }
  }
  return false;
}

TEST(RenderHoldsTable, HostileNamespaceIsOneLineWithTheEscapeVisible) {
  v1::ListHoldingsResponse r;
  v1::Holding* h = r.add_holdings();
  h->set_node("gke-a");
  *h->mutable_owner() = Pod("uid-x", "ml\n\x1b[31m", "train\r\x1b]0;owned\x07");
  v1::HeldDevice* d = h->add_devices();
  d->set_kind(v1::DEVICE_KIND_GPU);
  d->set_index(0);
  const std::string out = RenderHoldsTable(r, absl::Now());
  EXPECT_EQ(out,
            "NODE    OWNER                                      DEVICES   SINCE\n"
            "gke-a   pod ml\\n\\x1b[31m/train\\r\\x1b]0;owned\\x07   gpu0      -\n");
  EXPECT_FALSE(HasControlBytes(out, /*allow_newline=*/true));

  // JSON stays JSON, and carries the string exactly.
  const std::string json = HoldsJson(r).dump();
  EXPECT_FALSE(HasControlBytes(json, /*allow_newline=*/false));
  const Json back = Json::parse(json);
  EXPECT_EQ(back["holdings"][0]["owner"]["namespace"], "ml\n\x1b[31m");
}

TEST(RenderNodeDetail, HostileNodeFieldsAreEscaped) {
  v1::Node n = GpuNode();
  n.set_name("gke-a\x1b[2J");
  n.set_pool("pool\n\nfake: row");
  n.set_slurm_state("DRAIN");
  n.set_slurm_reason("maint\x1b]8;;http://x\x07");
  n.mutable_devices(0)->set_model("h100\u202e");
  AddHolder(AddDevice(&n, v1::DEVICE_KIND_GPU, 9, "l4"), Pod("u9", "a\tb", "c"), 1000);
  const std::string out = RenderNodeDetail(n);
  EXPECT_FALSE(HasControlBytes(out, /*allow_newline=*/true)) << out;
  EXPECT_THAT(out, HasSubstr("Name:         gke-a\\x1b[2J\n"));
  EXPECT_THAT(out, HasSubstr("Pool:         pool\\n\\nfake: row\n"));
  EXPECT_THAT(out, HasSubstr("DRAIN (maint\\x1b]8;;http://x\\x07)\n"));
  EXPECT_THAT(out, HasSubstr("h100\\u202e"));
  EXPECT_THAT(out, HasSubstr("pod a\\tb/c\n"));

  v1::ListNodesResponse nodes;
  *nodes.add_nodes() = n;
  const std::string table = RenderNodesTable(nodes);
  EXPECT_FALSE(HasControlBytes(table, /*allow_newline=*/true)) << table;
  EXPECT_THAT(table, HasSubstr("gke-a\\x1b[2J   Ready   DRAIN"));
}

TEST(RenderWorkloadTable, HostileHalfLifeAndModelsAreEscaped) {
  v1::WorkloadResponse r = TwoShapes();
  r.set_half_life("6h\x1b[8m");
  r.mutable_shapes(1)->set_models(0, "h100\n");
  const std::string out = RenderWorkloadTable(r);
  EXPECT_FALSE(HasControlBytes(out, /*allow_newline=*/true)) << out;
  EXPECT_THAT(out, HasSubstr("half-life 6h\\x1b[8m;"));
  EXPECT_THAT(out, HasSubstr("h100\\n"));
}

}  // namespace
}  // namespace duet::ctl
