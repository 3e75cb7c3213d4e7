// duet-node driven through the real kubelet protos by a test kubelet.
//
// The test kubelet serves v1beta1.Registration on <dir>/kubelet.sock and
// v1.PodResourcesLister on its own socket, and talks to duet-node's plugin
// socket as kubelet does (GetDevicePluginOptions, ListAndWatch, Allocate).
// duet-bridge is the real Bridge in process (file inventory, journal, gRPC
// on a free port); NodePlugin runs in process against it. Pods for the
// bypass cases come from the fake Kubernetes API server (tests/fakes).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "bridge/server/bridge.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "k8s/deviceplugin/v1beta1/deviceplugin.grpc.pb.h"
#include "k8s/podresources/v1/podresources.grpc.pb.h"
#include "k8s_adapter/device_plugin/node_plugin.h"
#include "tests/fakes/wait.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace node {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr char kInventory[] = R"(nodes:
  - name: gke-a
    cpus: 32
    memory_mib: 65536
    gpus: {count: 4, model: h100}
  - name: gke-t
    cpus: 16
    memory_mib: 32768
    tpus: {count: 4, model: v5e, host_bounds: 2x2}
)";

// kubelet's side: Registration and PodResources.
// The value of the unlabelled series `name` in Prometheus text; -1 if absent.
double Metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

class TestKubelet {
 public:
  explicit TestKubelet(std::string plugin_dir, std::string pod_resources_socket)
      : plugin_dir_(std::move(plugin_dir)), pr_socket_(std::move(pod_resources_socket)) {}
  ~TestKubelet() { Stop(); }

  void Start() {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + plugin_dir_ + "/kubelet.sock", grpc::InsecureServerCredentials());
    b.RegisterService(&registration_);
    registration_server_ = b.BuildAndStart();
    ASSERT_NE(registration_server_, nullptr);
    if (pr_server_ == nullptr) {
      grpc::ServerBuilder p;
      p.AddListeningPort("unix:" + pr_socket_, grpc::InsecureServerCredentials());
      p.RegisterService(&pod_resources_);
      pr_server_ = p.BuildAndStart();
      ASSERT_NE(pr_server_, nullptr);
    }
  }
  void Stop() {
    if (registration_server_ != nullptr) {
      registration_server_->Shutdown(std::chrono::system_clock::now());
      registration_server_.reset();
    }
    ::unlink((plugin_dir_ + "/kubelet.sock").c_str());
  }
  // What kubelet does when it starts: remove every socket in the directory,
  // then serve Registration on a new kubelet.sock.
  void Restart() {
    Stop();
    for (const auto& e : std::filesystem::directory_iterator(plugin_dir_)) {
      std::filesystem::remove(e.path());
    }
    Start();
  }

  std::vector<v1beta1::RegisterRequest> registrations() {
    absl::MutexLock lock(&registration_.mu);
    return registration_.requests;
  }
  bool WaitRegistrations(size_t n) {
    absl::MutexLock lock(&registration_.mu);
    auto enough = [&] { return registration_.requests.size() >= n; };
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!enough() && absl::Now() < deadline) {
      registration_.cv.WaitWithDeadline(&registration_.mu, deadline);
    }
    return enough();
  }
  // kubelet's record: pod ns/name -> container -> resource -> slot IDs.
  void SetPodResources(const ::v1::ListPodResourcesResponse& r) {
    absl::MutexLock lock(&pod_resources_.mu);
    pod_resources_.response = r;
  }
  // PodResources List calls answered so far.
  int pod_resource_lists() {
    absl::MutexLock lock(&pod_resources_.mu);
    return pod_resources_.lists;
  }
  // kubelet's allocatable devices per resource (every plugin's, as
  // GetAllocatableResources answers).
  void SetAllocatable(const std::string& resource, std::vector<std::string> ids) {
    absl::MutexLock lock(&pod_resources_.mu);
    auto* d = pod_resources_.allocatable.add_devices();
    d->set_resource_name(resource);
    for (const auto& id : ids) d->add_device_ids(id);
  }

 private:
  struct Registration final : public v1beta1::Registration::Service {
    grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req,
                          v1beta1::Empty*) override {
      if (req->version() != "v1beta1") {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unsupported version");
      }
      absl::MutexLock lock(&mu);
      requests.push_back(*req);
      cv.SignalAll();
      return grpc::Status::OK;
    }
    absl::Mutex mu;
    absl::CondVar cv;
    std::vector<v1beta1::RegisterRequest> requests ABSL_GUARDED_BY(mu);
  };
  struct PodResources final : public ::v1::PodResourcesLister::Service {
    grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                      ::v1::ListPodResourcesResponse* resp) override {
      absl::MutexLock lock(&mu);
      *resp = response;
      ++lists;
      return grpc::Status::OK;
    }
    grpc::Status GetAllocatableResources(grpc::ServerContext*,
                                         const ::v1::AllocatableResourcesRequest*,
                                         ::v1::AllocatableResourcesResponse* resp) override {
      absl::MutexLock lock(&mu);
      *resp = allocatable;
      return grpc::Status::OK;
    }
    absl::Mutex mu;
    ::v1::ListPodResourcesResponse response ABSL_GUARDED_BY(mu);
    int lists ABSL_GUARDED_BY(mu) = 0;
    ::v1::AllocatableResourcesResponse allocatable ABSL_GUARDED_BY(mu);
  };

  const std::string plugin_dir_;
  const std::string pr_socket_;
  Registration registration_;
  PodResources pod_resources_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> pr_server_;
};

class DevicePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("duet-dp-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "plugins");
    std::filesystem::create_directories(dir_ / "dev");
    std::filesystem::create_directories(dir_ / "pr");
    std::ofstream(dir_ / "nodes.yaml") << kInventory;
    for (const char* f : {"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm",
                          "accel0", "accel1", "accel2", "accel3"}) {
      std::ofstream(dir_ / "dev" / f) << "";
    }
    Config c;
    c.grpc.listen = "127.0.0.1:0";
    c.metrics.listen = "";
    c.journal.dir = (dir_ / "journal").string();
    c.journal.fsync = false;
    c.inventory.source = "file";
    c.inventory.file = (dir_ / "nodes.yaml").string();
    ASSERT_TRUE(ValidateConfig(c).ok());
    auto b = Bridge::Start(c);
    ASSERT_TRUE(b.ok()) << b.status();
    bridge_ = std::move(*b);
    kubelet_ = std::make_unique<TestKubelet>((dir_ / "plugins").string(),
                                             (dir_ / "pr" / "kubelet.sock").string());
    kubelet_->Start();
  }

  void TearDown() override {
    plugin_.reset();
    kubelet_.reset();
    bridge_.reset();
    api_.reset();
    kube_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Starts duet-node for `node`; with `kube_api` against the fake API server.
  void StartPlugin(const std::string& node, bool kube_api = false) {
    if (kube_api) {
      api_ = std::make_unique<k8s::testing::FakeApiServer>();
      ASSERT_TRUE(api_->ok());
      k8s::KubeConfig kc;
      kc.server = api_->url();
      auto client = k8s::NewCurlKubeClient(kc);
      ASSERT_TRUE(client.ok());
      kube_ = std::move(*client);
    }
    NodePluginOptions o;
    o.bridge = "127.0.0.1:" + std::to_string(bridge_->grpc_port());
    o.node_name = node;
    o.plugin_dir = (dir_ / "plugins").string();
    o.pod_resources_socket = (dir_ / "pr" / "kubelet.sock").string();
    o.device_dir = (dir_ / "dev").string();
    o.pod_resources_period = absl::Milliseconds(100);
    o.gpu_mounts = {"/opt/nvidia-driver:/usr/local/nvidia"};
    o.bridge_timeout = absl::Seconds(5);
    auto p = NodePlugin::Start(o, kube_.get());
    ASSERT_TRUE(p.ok()) << p.status();
    plugin_ = std::move(*p);
    ASSERT_TRUE(kubelet_->WaitRegistrations(1));
    // ... and duet-node has had kubelet's answer.
    ASSERT_TRUE(k8s::testing::WaitFor([&] { return plugin_->registrations() >= 1; }));
  }

  // kubelet's connection to the plugin's endpoint.
  std::unique_ptr<v1beta1::DevicePlugin::Stub> Plugin(const std::string& endpoint) {
    return v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(
        "unix:" + (dir_ / "plugins" / endpoint).string(), grpc::InsecureChannelCredentials()));
  }

  // Reads ListAndWatch until `want` is true of a list (or 10 s pass).
  static bool ReadUntil(grpc::ClientReader<v1beta1::ListAndWatchResponse>* reader,
                        const std::function<bool(const v1beta1::ListAndWatchResponse&)>& want,
                        v1beta1::ListAndWatchResponse* last) {
    while (reader->Read(last)) {
      if (want(*last)) return true;
    }
    return false;
  }
  static std::vector<std::string> Unhealthy(const v1beta1::ListAndWatchResponse& r) {
    std::vector<std::string> out;
    for (const auto& d : r.devices()) {
      if (d.health() == "Unhealthy") out.push_back(d.id());
    }
    return out;
  }

  void HoldOrDie(const HoldRequest& req) {
    auto r = bridge_->ledger()->Hold(req);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  static HoldRequest SlurmJob(const std::string& node, uint32_t job, std::vector<uint32_t> gpus) {
    HoldRequest h;
    h.node = node;
    h.owner = Owner::SlurmJob(job);
    for (uint32_t g : gpus) h.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
    return h;
  }
  static HoldRequest Placeholder(uint32_t job, const std::string& uid, DeviceKind kind,
                                 std::vector<uint32_t> idx, const std::string& node = "gke-a") {
    HoldRequest h;
    h.node = node;
    h.owner = Owner::Placeholder(job, uid);
    for (uint32_t i : idx) h.devices.push_back({kind, i, kWholeDevice});
    return h;
  }

  grpc::Status Allocate(v1beta1::DevicePlugin::Stub* stub, std::vector<std::string> slots,
                        v1beta1::AllocateResponse* resp) {
    v1beta1::AllocateRequest req;
    auto* c = req.add_container_requests();
    for (const auto& s : slots) c->add_devicesids(s);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub->Allocate(&ctx, req, resp);
  }

  std::vector<std::string> HostPaths(const v1beta1::ContainerAllocateResponse& r) {
    std::vector<std::string> out;
    for (const auto& d : r.devices()) {
      out.push_back(std::filesystem::path(d.host_path()).lexically_relative(dir_ / "dev").string());
    }
    return out;
  }

  nlohmann::json PendingPod(const std::string& name, const std::string& uid, const char* resource,
                            int count) {
    return {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", uid}}},
            {"spec",
             {{"nodeName", "gke-a"},
              {"schedulerName", "default-scheduler"},
              {"containers",
               {{{"name", "main"},
                 {"image", "cuda"},
                 {"resources",
                  {{"limits", {{resource, std::to_string(count)}}},
                   {"requests", {{"cpu", "2"}, {"memory", "4Gi"}}}}}}}}}},
            {"status", {{"phase", "Pending"}}}};
  }

  std::filesystem::path dir_;
  std::unique_ptr<Bridge> bridge_;
  std::unique_ptr<TestKubelet> kubelet_;
  std::unique_ptr<k8s::testing::FakeApiServer> api_;
  std::unique_ptr<k8s::KubeClient> kube_;
  std::unique_ptr<NodePlugin> plugin_;
};

TEST_F(DevicePluginTest, RegistersAndAdvertisesOneHealthySlotPerDevice) {
  StartPlugin("gke-a");
  auto regs = kubelet_->registrations();
  ASSERT_EQ(regs.size(), 1u);  // a GPU node: no TPU plugin
  EXPECT_EQ(regs[0].version(), "v1beta1");
  EXPECT_EQ(regs[0].resource_name(), "nvidia.com/gpu");
  EXPECT_EQ(regs[0].endpoint(), "duet-gpu.sock");
  EXPECT_FALSE(regs[0].options().pre_start_required());
  EXPECT_TRUE(regs[0].options().get_preferred_allocation_available());

  auto stub = Plugin("duet-gpu.sock");
  grpc::ClientContext octx;
  v1beta1::DevicePluginOptions opts;
  ASSERT_TRUE(stub->GetDevicePluginOptions(&octx, v1beta1::Empty(), &opts).ok());
  EXPECT_TRUE(opts.get_preferred_allocation_available());
  grpc::ClientContext pctx;
  v1beta1::PreferredAllocationRequest preq;
  auto* c = preq.add_container_requests();
  for (const char* id : {"gpu-slot-3", "gpu-slot-2", "gpu-slot-1"}) c->add_available_deviceids(id);
  c->add_must_include_deviceids("gpu-slot-3");
  c->set_allocation_size(2);
  v1beta1::PreferredAllocationResponse presp;
  ASSERT_TRUE(stub->GetPreferredAllocation(&pctx, preq, &presp).ok());
  ASSERT_EQ(presp.container_responses_size(), 1);
  EXPECT_THAT(presp.container_responses(0).deviceids(), ElementsAre("gpu-slot-3", "gpu-slot-1"));

  grpc::ClientContext ctx;
  auto reader = stub->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  std::vector<std::pair<std::string, std::string>> devices;
  for (const auto& d : list.devices()) devices.emplace_back(d.id(), d.health());
  EXPECT_THAT(devices, ElementsAre(Pair("gpu-slot-0", "Healthy"), Pair("gpu-slot-1", "Healthy"),
                                   Pair("gpu-slot-2", "Healthy"), Pair("gpu-slot-3", "Healthy")));
  ctx.TryCancel();
}

// GKE's managed NVIDIA plugin (or any other) already serves nvidia.com/gpu
// here: duet-node does not start, and says why and what to do.
TEST_F(DevicePluginTest, RefusesToStartWhereAnotherPluginAdvertisesItsResource) {
  kubelet_->SetAllocatable("nvidia.com/gpu", {"nvidia0", "nvidia1"});
  NodePluginOptions o;
  o.bridge = "127.0.0.1:" + std::to_string(bridge_->grpc_port());
  o.node_name = "gke-a";
  o.plugin_dir = (dir_ / "plugins").string();
  o.pod_resources_socket = (dir_ / "pr" / "kubelet.sock").string();
  o.device_dir = (dir_ / "dev").string();
  auto p = NodePlugin::Start(o, nullptr);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(),
              HasSubstr("another device plugin already advertises nvidia.com/gpu"));
  EXPECT_THAT(p.status().message(), HasSubstr("nvidia0, nvidia1"));
  EXPECT_THAT(p.status().message(), HasSubstr("gke-no-default-nvidia-gpu-device-plugin=true"));
  EXPECT_TRUE(kubelet_->registrations().empty());
}

// Its own slots in kubelet's list (duet-node restarted) and other resources
// are no reason to refuse.
TEST_F(DevicePluginTest, ItsOwnSlotsAndOtherResourcesAreNoConflict) {
  kubelet_->SetAllocatable("nvidia.com/gpu", {"gpu-slot-0", "gpu-slot-1"});
  kubelet_->SetAllocatable("example.com/nic", {"nic0"});
  EXPECT_TRUE(CheckSoleAdvertiser((dir_ / "pr" / "kubelet.sock").string()).ok());
  StartPlugin("gke-a");
  kubelet_->SetAllocatable("google.com/tpu", {"0", "1"});
  absl::Status s = CheckSoleAdvertiser((dir_ / "pr" / "kubelet.sock").string());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("advertises google.com/tpu"));
  // No kubelet to ask: nothing is refused on a guess.
  EXPECT_TRUE(CheckSoleAdvertiser((dir_ / "pr" / "missing.sock").string()).ok());
}

TEST_F(DevicePluginTest, SlurmTakingDevicesTurnsFreeSlotsUnhealthy) {
  StartPlugin("gke-a");
  // kubelet has given slots 2 and 3 to a running pod.
  ::v1::ListPodResourcesResponse pr;
  auto* pod = pr.add_pod_resources();
  pod->set_name("infer");
  pod->set_namespace_("ml");
  auto* dev = pod->add_containers()->add_devices();
  dev->set_resource_name("nvidia.com/gpu");
  dev->add_device_ids("gpu-slot-2");
  dev->add_device_ids("gpu-slot-3");
  kubelet_->SetPodResources(pr);
  // Two more reads: the first one after the change has been applied.
  const int lists = kubelet_->pod_resource_lists();
  ASSERT_TRUE(fakes::WaitFor([&] { return kubelet_->pod_resource_lists() >= lists + 2; },
                             fakes::kWaitTimeout, "two PodResources refreshes"));

  auto stub = Plugin("duet-gpu.sock");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_TRUE(Unhealthy(list).empty());

  // A Slurm job takes two GPUs: two slots go Unhealthy, not the pod's.
  HoldOrDie(SlurmJob("gke-a", 77, {0, 1}));
  ASSERT_TRUE(ReadUntil(
      reader.get(), [](const auto& r) { return Unhealthy(r).size() == 2; }, &list));
  EXPECT_THAT(Unhealthy(list), ElementsAre("gpu-slot-0", "gpu-slot-1"));
  EXPECT_THAT(plugin_->RenderMetrics(),
              HasSubstr("duet_node_slots{health=\"Unhealthy\",resource=\"nvidia.com/gpu\"} 2"));

  // The job ends: every slot is Healthy again.
  ASSERT_TRUE(bridge_->ledger()->Release("gke-a", Owner::SlurmJob(77)).ok());
  ASSERT_TRUE(ReadUntil(
      reader.get(), [](const auto& r) { return Unhealthy(r).empty(); }, &list));
  EXPECT_EQ(list.devices_size(), 4);
  ctx.TryCancel();
}

TEST_F(DevicePluginTest, AllocateGivesExactlyThePlaceholdersDevices) {
  StartPlugin("gke-a");
  HoldOrDie(Placeholder(42, "pod-2gpu", DeviceKind::kGpu, {1, 3}));
  HoldOrDie(SlurmJob("gke-a", 7, {0}));
  auto stub = Plugin("duet-gpu.sock");
  v1beta1::AllocateResponse resp;
  // kubelet picked slots 0 and 1; the pod gets the placeholder's 1 and 3.
  grpc::Status st = Allocate(stub.get(), {"gpu-slot-0", "gpu-slot-1"}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(resp.container_responses_size(), 1);
  const auto& c = resp.container_responses(0);
  EXPECT_THAT(HostPaths(c), ElementsAre("nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm"));
  EXPECT_EQ(c.devices(0).container_path(), "/dev/nvidia1");
  EXPECT_EQ(c.devices(0).permissions(), "rw");
  EXPECT_THAT(c.envs(), UnorderedElementsAre(Pair("NVIDIA_VISIBLE_DEVICES", "1,3"),
                                             Pair("CUDA_VISIBLE_DEVICES", "0,1")));
  EXPECT_EQ(c.annotations().at("duet.dev/pod-uid"), "pod-2gpu");
  ASSERT_EQ(c.mounts_size(), 1);
  EXPECT_EQ(c.mounts(0).host_path(), "/opt/nvidia-driver");
  EXPECT_EQ(c.mounts(0).container_path(), "/usr/local/nvidia");
  EXPECT_TRUE(c.mounts(0).read_only());

  // The same placeholder is not handed out twice.
  v1beta1::AllocateResponse again;
  st = Allocate(stub.get(), {"gpu-slot-2"}, &again);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("no pod being admitted holds 1 unassigned gpu"));
  EXPECT_THAT(plugin_->RenderMetrics(),
              HasSubstr("duet_node_allocations_total{resource=\"nvidia.com/gpu\"} 1"));
  EXPECT_THAT(plugin_->RenderMetrics(),
              HasSubstr("duet_node_allocation_refusals_total{reason=\"failed_precondition\","
                        "resource=\"nvidia.com/gpu\"} 1"));
  EXPECT_TRUE(bridge_->ledger()->CheckInvariants().ok());
}

TEST_F(DevicePluginTest, ExactCountFirstAndMultiContainerPods) {
  StartPlugin("gke-a");
  HoldOrDie(Placeholder(1, "two", DeviceKind::kGpu, {0, 2}));  // older
  HoldOrDie(Placeholder(2, "one", DeviceKind::kGpu, {3}));
  auto stub = Plugin("duet-gpu.sock");
  v1beta1::AllocateResponse r1, r2, r3;
  ASSERT_TRUE(Allocate(stub.get(), {"gpu-slot-0"}, &r1).ok());
  EXPECT_EQ(r1.container_responses(0).annotations().at("duet.dev/pod-uid"), "one");
  EXPECT_EQ(r1.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "3");
  // A two-container pod: each container gets one of its placeholder's GPUs.
  ASSERT_TRUE(Allocate(stub.get(), {"gpu-slot-1"}, &r2).ok());
  ASSERT_TRUE(Allocate(stub.get(), {"gpu-slot-2"}, &r3).ok());
  EXPECT_EQ(r2.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "0");
  EXPECT_EQ(r3.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "2");
}

TEST_F(DevicePluginTest, InitContainerSlotsPassedOnGetTheSameDevices) {
  StartPlugin("gke-a");
  HoldOrDie(Placeholder(3, "with-init", DeviceKind::kGpu, {2}));
  auto stub = Plugin("duet-gpu.sock");
  v1beta1::AllocateResponse init, app, other;
  ASSERT_TRUE(Allocate(stub.get(), {"gpu-slot-1"}, &init).ok());
  // kubelet reuses the init container's slot for the app container.
  grpc::Status st = Allocate(stub.get(), {"gpu-slot-1"}, &app);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(app.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "2");
  EXPECT_EQ(app.container_responses(0).annotations().at("duet.dev/pod-uid"), "with-init");
  // Another slot is another container: the pod has nothing left for it.
  EXPECT_EQ(Allocate(stub.get(), {"gpu-slot-0"}, &other).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Once the pod's placeholder is gone, its slot means nothing any more.
  ASSERT_TRUE(bridge_->ledger()->Release("gke-a", Owner::Placeholder(3, "with-init")).ok());
  // Refused as soon as the watch has delivered the release.
  EXPECT_TRUE(fakes::WaitFor(
      [&] {
        return Allocate(stub.get(), {"gpu-slot-1"}, &other).error_code() ==
               grpc::StatusCode::FAILED_PRECONDITION;
      },
      fakes::kWaitTimeout, "Allocate of the released pod's slot to be refused"));
}

TEST_F(DevicePluginTest, TpuNodeGetsChipsAndTpuVariables) {
  StartPlugin("gke-t");
  auto regs = kubelet_->registrations();
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_EQ(regs[0].resource_name(), "google.com/tpu");
  EXPECT_EQ(regs[0].endpoint(), "duet-tpu.sock");
  HoldOrDie(Placeholder(9, "tpu-pod", DeviceKind::kTpu, {0, 1, 2, 3}, "gke-t"));
  auto stub = Plugin("duet-tpu.sock");
  v1beta1::AllocateResponse resp;
  grpc::Status st =
      Allocate(stub.get(), {"tpu-slot-0", "tpu-slot-1", "tpu-slot-2", "tpu-slot-3"}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const auto& c = resp.container_responses(0);
  EXPECT_THAT(HostPaths(c), ElementsAre("accel0", "accel1", "accel2", "accel3"));
  EXPECT_EQ(c.mounts_size(), 0);  // GPU mounts are for GPU containers only
  EXPECT_THAT(c.envs(), UnorderedElementsAre(Pair("TPU_VISIBLE_CHIPS", "0,1,2,3"),
                                             Pair("TPU_CHIPS_PER_PROCESS_BOUNDS", "2,2,1"),
                                             Pair("TPU_PROCESS_BOUNDS", "1,1,1")));
}

TEST_F(DevicePluginTest, BypassPodGetsAPlaceholderOnTheSpot) {
  StartPlugin("gke-a", /*kube_api=*/true);
  HoldOrDie(SlurmJob("gke-a", 5, {0}));
  api_->Put(PendingPod("rogue", "uid-rogue", "nvidia.com/gpu", 2));
  auto stub = Plugin("duet-gpu.sock");
  v1beta1::AllocateResponse resp;
  grpc::Status st = Allocate(stub.get(), {"gpu-slot-0", "gpu-slot-1"}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  // The ledger now holds two GPUs for the pod, and the container got them.
  std::optional<Holding> h = bridge_->ledger()->FindHolding("gke-a", Owner::Pod("uid-rogue"));
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->devices.size(), 2u);
  const std::string want =
      std::to_string(h->devices[0].index) + "," + std::to_string(h->devices[1].index);
  EXPECT_EQ(resp.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), want);
  EXPECT_NE(h->devices[0].index, 0u);  // Slurm's GPU is never given
  EXPECT_NE(h->devices[1].index, 0u);
  EXPECT_THAT(
      plugin_->RenderMetrics(),
      HasSubstr("duet_node_placed_pods_total{resource=\"nvidia.com/gpu\",result=\"placed\"} 1"));
}

TEST_F(DevicePluginTest, BypassPodIsRefusedClearlyWhenThereIsNoRoom) {
  StartPlugin("gke-a", /*kube_api=*/true);
  HoldOrDie(SlurmJob("gke-a", 5, {0, 1, 2}));
  api_->Put(PendingPod("greedy", "uid-greedy", "nvidia.com/gpu", 2));
  auto stub = Plugin("duet-gpu.sock");
  v1beta1::AllocateResponse resp;
  grpc::Status st = Allocate(stub.get(), {"gpu-slot-0", "gpu-slot-3"}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("pod ml/greedy did not go through the duet scheduler"));
  EXPECT_THAT(st.error_message(), HasSubstr("no room for it on node gke-a"));
  EXPECT_FALSE(bridge_->ledger()->FindHolding("gke-a", Owner::Pod("uid-greedy")).has_value());
  EXPECT_EQ(bridge_->ledger()->holding_count(), 1u);
  EXPECT_THAT(plugin_->RenderMetrics(),
              HasSubstr("duet_node_allocation_refusals_total{reason=\"resource_exhausted\","
                        "resource=\"nvidia.com/gpu\"} 1"));
}

TEST_F(DevicePluginTest, KubeletCrossCheckSkipsPlaceholdersOfPodsNotPendingHere) {
  StartPlugin("gke-a", /*kube_api=*/true);
  // Two 1-GPU placeholders; only the newer one's pod is pending on this node.
  HoldOrDie(Placeholder(1, "uid-gone", DeviceKind::kGpu, {1}));
  HoldOrDie(Placeholder(2, "uid-here", DeviceKind::kGpu, {2}));
  api_->Put(PendingPod("here", "uid-here", "nvidia.com/gpu", 1));
  auto stub = Plugin("duet-gpu.sock");
  v1beta1::AllocateResponse resp;
  grpc::Status st = Allocate(stub.get(), {"gpu-slot-3"}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.container_responses(0).annotations().at("duet.dev/pod-uid"), "uid-here");
  EXPECT_EQ(resp.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "2");
}

TEST_F(DevicePluginTest, RegistersAgainWhenKubeletRestarts) {
  StartPlugin("gke-a");
  ASSERT_EQ(kubelet_->registrations().size(), 1u);
  kubelet_->Restart();  // removes duet-gpu.sock and recreates kubelet.sock
  ASSERT_TRUE(kubelet_->WaitRegistrations(2));
  EXPECT_EQ(kubelet_->registrations()[1].resource_name(), "nvidia.com/gpu");
  ASSERT_TRUE(k8s::testing::WaitFor([&] { return plugin_->registrations() >= 2; }));
  // The plugin serves again on a fresh socket.
  auto stub = Plugin("duet-gpu.sock");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ctx.set_wait_for_ready(true);
  auto reader = stub->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_EQ(list.devices_size(), 4);
  ctx.TryCancel();
  EXPECT_THAT(
      plugin_->RenderMetrics(),
      HasSubstr("duet_node_registrations_total{resource=\"nvidia.com/gpu\",result=\"ok\"} 2"));
}

TEST_F(DevicePluginTest, TalksToABridgeThatRequiresClientCertificates) {
  const std::string certs = (dir_ / "certs").string();
  std::filesystem::create_directories(certs);
  k8s::testing::TlsFiles tls = k8s::testing::MakeTestCerts(certs);
  ASSERT_FALSE(tls.ca.empty()) << "openssl failed";
  Config c;
  c.grpc.listen = "127.0.0.1:0";
  c.metrics.listen = "";
  c.grpc.tls.cert_file = tls.cert;
  c.grpc.tls.key_file = tls.key;
  c.grpc.tls.client_ca_file = tls.ca;
  c.journal.dir = (dir_ / "journal-tls").string();
  c.journal.fsync = false;
  c.inventory.source = "file";
  c.inventory.file = (dir_ / "nodes.yaml").string();
  auto b = Bridge::Start(c);
  ASSERT_TRUE(b.ok()) << b.status();
  NodePluginOptions o;
  o.bridge = "127.0.0.1:" + std::to_string((*b)->grpc_port());
  o.node_name = "gke-a";
  o.plugin_dir = (dir_ / "plugins").string();
  o.pod_resources_socket = "";
  o.device_dir = (dir_ / "dev").string();
  o.bridge_ca_file = tls.ca;
  // Without a client certificate the bridge refuses: no node, no plugin.
  auto refused = NodePlugin::Start(o, nullptr);
  ASSERT_TRUE(refused.ok()) << refused.status();
  // Its watch of the bridge was tried and ended.
  ASSERT_TRUE(fakes::WaitFor(
      [&] { return Metric((*refused)->RenderMetrics(), "duet_node_bridge_watch_restarts_total") >= 1; },
      fakes::kWaitTimeout, "the refused watch to end"));
  EXPECT_FALSE((*refused)->have_node());
  EXPECT_TRUE(kubelet_->registrations().empty());
  refused->reset();
  // With one it works.
  o.bridge_cert_file = tls.client_cert;
  o.bridge_key_file = tls.client_key;
  auto p = NodePlugin::Start(o, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(kubelet_->WaitRegistrations(1));
  EXPECT_TRUE((*p)->have_node());
  p->reset();
  // A key without a certificate, or a missing file, is refused up front.
  o.bridge_cert_file = "";
  EXPECT_EQ(NodePlugin::Start(o, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  o.bridge_cert_file = certs + "/missing.crt";
  auto missing = NodePlugin::Start(o, nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("--bridge-cert: cannot read"));
}

// auth.mode token end to end: duet-node sends its projected ServiceAccount
// token (re-read on every call) over TLS; the bridge reviews it with the API
// server. A token bound to another node is refused and changes nothing; the
// node's own token (after a rotation of the file) places the pod.
TEST_F(DevicePluginTest, BypassPodIsPlacedOnlyWithItsOwnNodesToken) {
  const std::string certs = (dir_ / "certs").string();
  std::filesystem::create_directories(certs);
  k8s::testing::TlsFiles tls = k8s::testing::MakeTestCerts(certs);
  ASSERT_FALSE(tls.ca.empty()) << "openssl failed";
  api_ = std::make_unique<k8s::testing::FakeApiServer>();
  ASSERT_TRUE(api_->ok());
  k8s::KubeConfig kc;
  kc.server = api_->url();
  auto client = k8s::NewCurlKubeClient(kc);
  ASSERT_TRUE(client.ok());
  kube_ = std::move(*client);
  const std::string sa = "system:serviceaccount:duet-system:duet-node";
  for (const char* node : {"gke-a", "gke-t"}) {
    api_->Control("token", {{"token", std::string("token-of-") + node},
                            {"username", sa},
                            {"audiences", {"duet-bridge"}},
                            {"extra", {{"authentication.kubernetes.io/node-name", {node}}}}});
  }
  api_->Put(PendingPod("rogue", "uid-rogue", "nvidia.com/gpu", 2));
  k8s::testing::WriteKubeconfig((dir_ / "kubeconfig").string(), api_->url());
  Config c;
  c.grpc.listen = "127.0.0.1:0";
  c.metrics.listen = "";
  c.grpc.tls.cert_file = tls.cert;
  c.grpc.tls.key_file = tls.key;
  c.journal.dir = (dir_ / "journal-auth").string();
  c.journal.fsync = false;
  c.inventory.source = "file";
  c.inventory.file = (dir_ / "nodes.yaml").string();
  c.kubernetes.kubeconfig = (dir_ / "kubeconfig").string();
  c.auth.mode = "token";
  c.auth.node_service_account = sa;
  ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  auto b = Bridge::Start(c);
  ASSERT_TRUE(b.ok()) << b.status();

  const std::string token_file = (dir_ / "token").string();
  std::ofstream(token_file) << "token-of-gke-t\n";  // another node's token
  NodePluginOptions o;
  o.bridge = "127.0.0.1:" + std::to_string((*b)->grpc_port());
  o.node_name = "gke-a";
  o.plugin_dir = (dir_ / "plugins").string();
  o.pod_resources_socket = (dir_ / "pr" / "kubelet.sock").string();
  o.pod_resources_period = absl::Milliseconds(100);
  o.device_dir = (dir_ / "dev").string();
  o.bridge_ca_file = tls.ca;
  o.bridge_token_file = token_file;
  o.bridge_timeout = absl::Seconds(5);
  auto p = NodePlugin::Start(o, kube_.get());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(kubelet_->WaitRegistrations(1));
  auto stub = Plugin("duet-gpu.sock");
  v1beta1::AllocateResponse resp;
  grpc::Status st = Allocate(stub.get(), {"gpu-slot-0", "gpu-slot-1"}, &resp);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.error_message(), HasSubstr("may not act on node gke-a"));
  EXPECT_EQ((*b)->ledger()->holding_count(), 0u);
  EXPECT_THAT((*b)->metrics()->Render(),
              HasSubstr("duet_grpc_auth_refusals_total{method=\"PlacePod\",reason=\"wrong_node\"} 1"));

  std::ofstream(token_file) << "token-of-gke-a\n";  // kubelet rotated the file
  resp.Clear();
  st = Allocate(stub.get(), {"gpu-slot-0", "gpu-slot-1"}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::optional<Holding> h = (*b)->ledger()->FindHolding("gke-a", Owner::Pod("uid-rogue"));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->devices.size(), 2u);
  p->reset();
  b->reset();
}

// The real binary: flags wired through main, registration, clean SIGTERM.
TEST_F(DevicePluginTest, TheBinaryRegistersAndStopsCleanlyOnSigterm) {
  const std::string bridge = "127.0.0.1:" + std::to_string(bridge_->grpc_port());
  const std::string plugin_dir = (dir_ / "plugins").string();
  const std::string device_dir = (dir_ / "dev").string();
  std::vector<std::string> args = {DUET_NODE_BINARY,
                                   "--bridge",
                                   bridge,
                                   "--plugin-dir",
                                   plugin_dir,
                                   "--pod-resources-socket",
                                   "",
                                   "--device-dir",
                                   device_dir,
                                   "--no-kubernetes",
                                   "--log-level",
                                   "warn"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string node_env = "NODE_NAME=gke-t";  // the default for --node-name
  char* envp[] = {node_env.data(), nullptr};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execve(argv[0], argv.data(), envp);
    ::_exit(127);
  }
  const bool registered = kubelet_->WaitRegistrations(1);
  const bool socket_up = std::filesystem::exists(dir_ / "plugins" / "duet-tpu.sock");
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(registered);
  EXPECT_TRUE(socket_up);
  EXPECT_EQ(kubelet_->registrations()[0].resource_name(), "google.com/tpu");
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "plugins" / "duet-tpu.sock"));
}

// The binary outside a cluster: --kube-server, --kube-token-file and
// --kube-ca-file reach the API server over TLS with the token, so a pod that
// bypassed the duet scheduler is placed on the spot.
TEST_F(DevicePluginTest, TheBinaryReachesTheApiServerNamedByItsFlags) {
  const std::string certs = (dir_ / "certs").string();
  std::filesystem::create_directories(certs);
  k8s::testing::TlsFiles tls = k8s::testing::MakeTestCerts(certs);
  ASSERT_FALSE(tls.ca.empty()) << "openssl failed";
  api_ = std::make_unique<k8s::testing::FakeApiServer>(
      std::vector<std::string>{"--tls-cert", tls.cert, "--tls-key", tls.key, "--token", "node-s3cret"});
  ASSERT_TRUE(api_->ok());
  api_->Put(PendingPod("rogue", "uid-rogue", "nvidia.com/gpu", 2));
  const std::string token_file = (dir_ / "kube-token").string();
  std::ofstream(token_file) << "node-s3cret\n";
  std::vector<std::string> args = {DUET_NODE_BINARY,
                                   "--bridge",
                                   "127.0.0.1:" + std::to_string(bridge_->grpc_port()),
                                   "--node-name",
                                   "gke-a",
                                   "--plugin-dir",
                                   (dir_ / "plugins").string(),
                                   "--pod-resources-socket",
                                   "",
                                   "--device-dir",
                                   (dir_ / "dev").string(),
                                   "--kube-server",
                                   api_->url(),
                                   "--kube-token-file",
                                   token_file,
                                   "--kube-ca-file",
                                   tls.ca,
                                   "--log-level",
                                   "warn"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char* envp[] = {nullptr};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execve(argv[0], argv.data(), envp);
    ::_exit(127);
  }
  const bool registered = kubelet_->WaitRegistrations(1);
  grpc::Status st = grpc::Status(grpc::StatusCode::UNKNOWN, "not registered");
  v1beta1::AllocateResponse resp;
  if (registered) {
    auto stub = Plugin("duet-gpu.sock");
    st = Allocate(stub.get(), {"gpu-slot-0", "gpu-slot-1"}, &resp);
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(registered);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.container_responses(0).annotations().at("duet.dev/pod-uid"), "uid-rogue");
  EXPECT_TRUE(bridge_->ledger()->FindHolding("gke-a", Owner::Pod("uid-rogue")).has_value());
  bool listed_with_token = false;
  for (const nlohmann::json& r : api_->Requests()) {
    if (r.value("path", "").rfind("/api/v1/pods", 0) == 0 &&
        r.value("auth", "") == "Bearer node-s3cret") {
      listed_with_token = true;
    }
  }
  EXPECT_TRUE(listed_with_token);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ValidateOptionsTest, NamesTheFlag) {
  NodePluginOptions o;
  o.bridge = "127.0.0.1:1";
  o.node_name = "n";
  EXPECT_TRUE(ValidateOptions(o).ok());
  for (const char* bad : {"relative:/x", "/x", "/x:", "/x:rel"}) {
    o.gpu_mounts = {bad};
    absl::Status s = ValidateOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--gpu-mount")) << bad;
  }
  o.gpu_mounts.clear();
  o.bridge_key_file = "k.pem";
  EXPECT_THAT(std::string(ValidateOptions(o).message()), HasSubstr("--bridge-cert, --bridge-key"));
  o.bridge_key_file.clear();
  o.bridge = "unix:/run/duet.sock";
  o.bridge_ca_file = "ca.pem";
  EXPECT_THAT(std::string(ValidateOptions(o).message()), HasSubstr("unix socket has no TLS"));
  o.bridge_ca_file.clear();
  o.bridge = "127.0.0.1:1";
  o.bridge_token_file = "/var/run/secrets/duet/token";
  EXPECT_THAT(std::string(ValidateOptions(o).message()), HasSubstr("--bridge-token-file"));
  o.bridge_ca_file = "ca.pem";
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.bridge_ca_file.clear();
  o.bridge_token_file.clear();
  o.node_name.clear();
  EXPECT_THAT(std::string(ValidateOptions(o).message()), HasSubstr("--node-name"));
}

TEST(DuetNodeBinaryTest, BadFlagsExitTwoAndNameTheFlag) {
  std::string cmd =
      std::string("env -u NODE_NAME ") + DUET_NODE_BINARY + " --bridge x --no-kubernetes 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[512] = {0};
  std::string out;
  while (std::fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  const int status = ::pclose(f);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(out, HasSubstr("--node-name: must be set"));
}

// Flags for the Kubernetes API that do not go together, a token file that
// cannot be read, and the --kubeconfig flag duet-node no longer has: exit
// non-zero, naming the flag.
TEST(DuetNodeBinaryTest, BadKubeFlagsExitNonZeroAndNameTheFlag) {
  struct Case {
    std::string flags;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--kube-server https://127.0.0.1:6443", 2, "--kube-server: needs --kube-token-file"},
      {"--kube-token-file /tmp/t", 2, "--kube-token-file, --kube-ca-file: need --kube-server"},
      {"--kube-ca-file /tmp/ca.crt", 2, "--kube-token-file, --kube-ca-file: need --kube-server"},
      {"--kube-server http://127.0.0.1:8080 --kube-token-file /tmp/t", 2,
       "--kube-server: must be https://host[:port]"},
      {"--no-kubernetes --kube-server https://127.0.0.1:6443 --kube-token-file /tmp/t", 2,
       "--no-kubernetes: cannot be given with --kube-server"},
      {"--kube-server https://127.0.0.1:6443 --kube-token-file /nonexistent/duet-token", 2,
       "--kube-token-file: cannot read /nonexistent/duet-token"},
      {"--kubeconfig /tmp/kubeconfig", -1, "--kubeconfig"},
  };
  for (const Case& c : cases) {
    const std::string cmd = std::string(DUET_NODE_BINARY) + " --bridge 127.0.0.1:1 --node-name n " +
                            "--plugin-dir /nonexistent/duet-plugins " + c.flags + " 2>&1";
    FILE* f = ::popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[512] = {0};
    std::string out;
    while (std::fgets(buf, sizeof(buf), f) != nullptr) out += buf;
    const int status = ::pclose(f);
    ASSERT_TRUE(WIFEXITED(status)) << c.flags;
    if (c.code >= 0) {
      EXPECT_EQ(WEXITSTATUS(status), c.code) << c.flags << ": " << out;
    } else {
      EXPECT_NE(WEXITSTATUS(status), 0) << c.flags << ": " << out;
    }
    EXPECT_THAT(out, HasSubstr(c.message)) << c.flags;
  }
}

}  // namespace
}  // namespace node
}  // namespace duet
