#include "k8s_adapter/device_plugin/node_plugin.h"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/metrics/metrics.h"
#include "common/slurm/slurm_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace node {
namespace {

constexpr char kKubeletSocket[] = "kubelet.sock";
constexpr char kApiVersion[] = "v1beta1";

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Tells one incarnation of a file from the next (an inode number alone may
// be reused); "" when the file is missing.
std::string SocketIdentity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec);
}

std::string KindLabel(DeviceKind kind) { return ResourceFor(kind).resource_name; }

}  // namespace

// ---------------------------------------------------------------------------
// The v1beta1.DevicePlugin service for one resource. Thin: NodePlugin does
// the work. One instance per server start (a gRPC service registers with one
// server only).

class NodePlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  Service(NodePlugin* plugin, DeviceKind kind) : plugin_(plugin), kind_(kind) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* resp) override {
    resp->set_pre_start_required(false);
    resp->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    return plugin_->ListAndWatch(kind_, ctx, writer);
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* resp) override {
    for (const auto& c : req->container_requests()) {
      std::vector<std::string> available(c.available_deviceids().begin(),
                                         c.available_deviceids().end());
      std::vector<std::string> must(c.must_include_deviceids().begin(),
                                    c.must_include_deviceids().end());
      auto* out = resp->add_container_responses();
      for (auto& id : PreferredSlots(kind_, available, must, c.allocation_size())) {
        out->add_deviceids(id);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override {
    return plugin_->Allocate(kind_, *req, resp);
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  NodePlugin* const plugin_;
  const DeviceKind kind_;
};

// ---------------------------------------------------------------------------

NodePlugin::NodePlugin(const NodePluginOptions& options, k8s::KubeClient* kube,
                       std::shared_ptr<grpc::ChannelCredentials> bridge_credentials)
    : options_(options), kube_(kube), registry_(std::make_shared<prometheus::Registry>()) {
  allocations_ =
      &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_allocations_total",
                      "Containers given devices by Allocate, by resource");
  refusals_ =
      &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_allocation_refusals_total",
                      "Allocate calls refused, by resource and reason (status code)");
  placed_ = &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_placed_pods_total",
                            "Placeholders asked on the spot for pods that bypassed the duet "
                            "scheduler, by resource and result");
  registrations_total_ =
      &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_registrations_total",
                      "Registrations with kubelet, by resource and result");
  slots_ = &RegisterFamily(prometheus::BuildGauge(), *registry_, "duet_node_slots",
                           "Slots advertised to kubelet, by resource and health");
  allocate_seconds_ =
      &RegisterFamily(prometheus::BuildHistogram(), *registry_, "duet_node_allocate_seconds",
                      "Allocate latency, by resource");
  watch_restarts_ = &RegisterFamily(prometheus::BuildCounter(), *registry_,
                                    "duet_node_bridge_watch_restarts_total",
                                    "Times the bridge's WatchNodes stream ended and was reopened")
                         .Add({});
  watch_connected_ =
      &RegisterFamily(prometheus::BuildGauge(), *registry_, "duet_node_bridge_watch_connected",
                      "1 while the bridge's WatchNodes stream delivers events")
           .Add({});
  bridge_ = std::make_unique<BridgeLink>(options_, std::move(bridge_credentials), watch_restarts_,
                                         watch_connected_);
}

absl::StatusOr<std::unique_ptr<NodePlugin>> NodePlugin::Start(const NodePluginOptions& options,
                                                              k8s::KubeClient* kube) {
  if (absl::Status v = ValidateOptions(options); !v.ok()) return v;
  if (absl::Status v = CheckSoleAdvertiser(options.pod_resources_socket); !v.ok()) return v;
  auto creds = BridgeCredentials(options);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<NodePlugin> p(new NodePlugin(options, kube, *creds));
  if (!options.metrics_listen.empty()) {
    auto exposer = ServeMetrics("--metrics-listen", options.metrics_listen);
    if (!exposer.ok()) return exposer.status();
    p->exposer_ = *std::move(exposer);
    p->exposer_->RegisterCollectable(p->registry_);
  }
  std::error_code ec;
  std::filesystem::create_directories(options.plugin_dir, ec);
  NodePlugin* self = p.get();
  p->bridge_->StartWatch([self](const v1::Node* node) { self->OnNode(node); });
  p->kubelet_thread_ = std::thread([self] { self->KubeletLoop(); });
  spdlog::info("duet-node {}: bridge {}, plugin dir {}, pod resources {}, Kubernetes API {}",
               options.node_name, options.bridge, options.plugin_dir,
               options.pod_resources_socket.empty() ? "-" : options.pod_resources_socket,
               kube != nullptr ? "yes" : "no");
  return p;
}

NodePlugin::~NodePlugin() { Shutdown(); }

void NodePlugin::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  bridge_->Stop();
  if (kubelet_thread_.joinable()) kubelet_thread_.join();
  for (auto& [kind, server] : servers_) {
    if (server == nullptr) continue;
    server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    server->Wait();
    ::unlink(absl::StrCat(options_.plugin_dir, "/", ResourceFor(kind).endpoint).c_str());
  }
  servers_.clear();
  services_.clear();
  exposer_.reset();
}

int NodePlugin::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

bool NodePlugin::have_node() const {
  absl::MutexLock lock(&mu_);
  return node_.has_value();
}

int NodePlugin::metrics_port() const {
  if (exposer_ == nullptr) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string NodePlugin::RenderMetrics() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

// ---------------------------------------------------------------------------
// The bridge's change stream for this node.

void NodePlugin::OnNode(const v1::Node* node) {
  absl::MutexLock lock(&mu_);
  if (node != nullptr) {
    node_ = *node;
  } else {
    node_.reset();
  }
  RecomputeLocked();
}

void NodePlugin::RecomputeLocked() {
  std::set<std::string> live;
  if (node_) live = PodUidsHolding(*node_);
  for (const auto& uid : live) seen_live_.insert(uid);
  for (DeviceKind kind : kAllKinds) {
    const int count = node_ ? DeviceCount(*node_, kind) : 0;
    auto it = kinds_.find(kind);
    if (count == 0 && it == kinds_.end()) continue;
    KindState& ks = kinds_[kind];
    const int slots = node_ ? count : ks.slots;
    if (node_) {
      // Pods that held devices and no longer do have ended: forget what
      // they got.
      std::set<std::string> ended;
      for (const auto& uid : seen_live_) {
        if (!live.count(uid)) ended.insert(uid);
      }
      auto& sp = slot_pod_[kind];
      for (auto s = sp.begin(); s != sp.end();)
        s = ended.count(s->second.uid) ? sp.erase(s) : std::next(s);
      auto& ho = handed_out_[kind];
      for (auto h = ho.begin(); h != ho.end();)
        h = ended.count(h->first) ? ho.erase(h) : std::next(h);
    }
    std::set<int> allocated = kubelet_allocated_[kind];
    for (const auto& [slot, use] : slot_pod_[kind]) allocated.insert(slot);
    const int wanted = node_ ? SlurmHeldCount(*node_, kind) : slots;
    std::set<int> unhealthy = ChooseUnhealthy(slots, wanted, allocated, ks.unhealthy);
    if (slots != ks.slots || unhealthy != ks.unhealthy) {
      ks.slots = slots;
      ks.unhealthy = std::move(unhealthy);
      ++ks.version;
      const int bad = static_cast<int>(ks.unhealthy.size());
      slots_->Add({{"resource", KindLabel(kind)}, {"health", "Unhealthy"}}).Set(bad);
      slots_->Add({{"resource", KindLabel(kind)}, {"health", "Healthy"}}).Set(slots - bad);
      cv_.SignalAll();
    }
  }
  if (node_) {
    for (auto it = seen_live_.begin(); it != seen_live_.end();) {
      it = live.count(*it) ? std::next(it) : seen_live_.erase(it);
    }
  }
}

v1beta1::ListAndWatchResponse NodePlugin::DeviceListLocked(DeviceKind kind) const {
  v1beta1::ListAndWatchResponse r;
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) return r;
  for (int s = 0; s < it->second.slots; ++s) {
    auto* d = r.add_devices();
    d->set_id(SlotId(kind, s));
    d->set_health(it->second.unhealthy.count(s) ? "Unhealthy" : "Healthy");
  }
  return r;
}

grpc::Status NodePlugin::ListAndWatch(DeviceKind kind, grpc::ServerContext* ctx,
                                      grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  uint64_t epoch = 0;
  uint64_t sent = 0;
  {
    absl::MutexLock lock(&mu_);
    epoch = kinds_[kind].epoch;
  }
  while (true) {
    v1beta1::ListAndWatchResponse resp;
    bool send = false;
    {
      absl::MutexLock lock(&mu_);
      const KindState& ks = kinds_[kind];
      if (!stopping_ && ks.epoch == epoch && ks.version == sent) {
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(250));
      }
      const KindState& now = kinds_[kind];
      if (stopping_ || now.epoch != epoch) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "duet-node is restarting the plugin");
      }
      if (now.version != sent) {
        resp = DeviceListLocked(kind);
        sent = now.version;
        send = true;
      }
    }
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (send && !writer->Write(resp)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "kubelet closed the stream");
    }
  }
}

// ---------------------------------------------------------------------------
// Kubelet: registration, re-registration, PodResources.

void NodePlugin::KubeletLoop() {
  // inotify only wakes the loop early; what to do is decided from the files.
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0 || ::inotify_add_watch(fd, options_.plugin_dir.c_str(),
                                    IN_CREATE | IN_MOVED_TO | IN_DELETE) < 0) {
    spdlog::warn("inotify on {}: {}; falling back to polling", options_.plugin_dir,
                 std::strerror(errno));
  }
  const std::string kubelet_sock = absl::StrCat(options_.plugin_dir, "/", kKubeletSocket);
  std::map<DeviceKind, absl::Time> next_register;
  absl::Time next_pod_resources = absl::InfinitePast();
  while (true) {
    std::vector<DeviceKind> active;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      for (const auto& [kind, ks] : kinds_) {
        if (ks.slots > 0 || servers_.count(kind)) active.push_back(kind);
      }
    }
    // Which kubelet is there now: a restarted kubelet has a new kubelet.sock.
    const std::string kubelet_id = SocketIdentity(kubelet_sock);
    for (DeviceKind kind : active) {
      const std::string sock = absl::StrCat(options_.plugin_dir, "/", ResourceFor(kind).endpoint);
      std::string registered_with;
      {
        absl::MutexLock lock(&mu_);
        registered_with = kinds_[kind].kubelet_id;
      }
      const bool new_kubelet =
          !registered_with.empty() && !kubelet_id.empty() && kubelet_id != registered_with;
      if (new_kubelet) {
        spdlog::info("{} was recreated: kubelet restarted; registering {} again", kubelet_sock,
                     ResourceFor(kind).resource_name);
      }
      // kubelet removes every plugin socket when it starts: serve afresh.
      if (servers_[kind] == nullptr || !Exists(sock) || new_kubelet) {
        RestartServer(kind);
        next_register[kind] = absl::InfinitePast();
        registered_with.clear();
      }
      if (!registered_with.empty() || servers_[kind] == nullptr || kubelet_id.empty() ||
          absl::Now() < next_register[kind]) {
        continue;
      }
      // Another plugin may have come up since Start (a node still booting).
      absl::Status s = CheckSoleAdvertiser(options_.pod_resources_socket);
      if (s.ok()) s = Register(kind);
      registrations_total_
          ->Add({{"resource", KindLabel(kind)}, {"result", s.ok() ? "ok" : "error"}})
          .Increment();
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        kinds_[kind].kubelet_id = kubelet_id;
        ++registrations_;
        spdlog::info("registered {} with kubelet ({})", ResourceFor(kind).resource_name, sock);
      } else {
        spdlog::warn("register {} with kubelet: {}", ResourceFor(kind).resource_name, s.ToString());
        next_register[kind] = absl::Now() + absl::Seconds(1);
      }
    }
    if (absl::Now() >= next_pod_resources) {
      RefreshPodResources();
      next_pod_resources = absl::Now() + options_.pod_resources_period;
    }
    // Sleep until the directory changes, or 200 ms (socket checks, retries).
    if (fd >= 0) {
      struct pollfd pfd = {fd, POLLIN, 0};
      if (::poll(&pfd, 1, 200) > 0) {
        alignas(struct inotify_event) char buf[4096];
        while (::read(fd, buf, sizeof(buf)) > 0) {
        }
      }
    } else {
      absl::SleepFor(absl::Milliseconds(200));
    }
  }
  if (fd >= 0) ::close(fd);
}

void NodePlugin::RestartServer(DeviceKind kind) {
  const std::string sock = absl::StrCat(options_.plugin_dir, "/", ResourceFor(kind).endpoint);
  if (servers_[kind] != nullptr) {
    {
      absl::MutexLock lock(&mu_);
      ++kinds_[kind].epoch;  // ends the old server's ListAndWatch streams
      cv_.SignalAll();
    }
    servers_[kind]->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    servers_[kind]->Wait();
    servers_[kind].reset();
  }
  {
    absl::MutexLock lock(&mu_);
    kinds_[kind].kubelet_id.clear();
  }
  ::unlink(sock.c_str());
  services_[kind] = std::make_unique<Service>(this, kind);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + sock, grpc::InsecureServerCredentials());
  builder.RegisterService(services_[kind].get());
  servers_[kind] = builder.BuildAndStart();
  if (servers_[kind] == nullptr) {
    spdlog::error("cannot serve the {} device plugin on {}", ResourceFor(kind).resource_name, sock);
  }
}

absl::Status NodePlugin::Register(DeviceKind kind) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("unix:", options_.plugin_dir, "/", kKubeletSocket),
                          grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1beta1::RegisterRequest req;
  req.set_version(kApiVersion);
  req.set_endpoint(ResourceFor(kind).endpoint);
  req.set_resource_name(ResourceFor(kind).resource_name);
  req.mutable_options()->set_pre_start_required(false);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  v1beta1::Empty resp;
  return FromGrpc(stub->Register(&ctx, req, &resp), "kubelet Registration");
}

void NodePlugin::RefreshPodResources() {
  std::optional<KubeletGiven> given = ListKubeletGiven(options_.pod_resources_socket);
  if (!given) return;
  absl::MutexLock lock(&mu_);
  kubelet_allocated_ = std::move(given->allocated);
  served_ = std::move(given->served);
  RecomputeLocked();
}

// ---------------------------------------------------------------------------
// Allocate

std::optional<Match> NodePlugin::SameSlotsAgain(
    const std::vector<int>& slots, const std::map<int, SlotUse>& known,
    const std::vector<PodClaim>& claims, const std::optional<std::vector<PendingPod>>& pending) {
  std::string uid;
  std::vector<uint32_t> devices;
  for (int s : slots) {
    auto it = known.find(s);
    if (it == known.end() || (!uid.empty() && it->second.uid != uid)) return std::nullopt;
    uid = it->second.uid;
    devices.push_back(it->second.device);
  }
  if (uid.empty()) return std::nullopt;
  // Only while that pod still holds those devices and (when the API
  // answers) is still waiting to start here: a slot of a pod that ended may
  // be reused by kubelet for another pod before the ledger has caught up.
  if (pending.has_value() && std::none_of(pending->begin(), pending->end(),
                                          [&](const PendingPod& p) { return p.uid == uid; })) {
    return std::nullopt;
  }
  for (const PodClaim& c : claims) {
    if (c.uid != uid) continue;
    for (uint32_t d : devices) {
      if (std::find(c.devices.begin(), c.devices.end(), d) == c.devices.end()) return std::nullopt;
    }
    Match m;
    m.claim = c;
    m.devices = devices;
    std::sort(m.devices.begin(), m.devices.end());
    return m;
  }
  return std::nullopt;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> NodePlugin::Answer(
    DeviceKind kind, const std::vector<uint32_t>& devices, const std::string& uid) const {
  absl::StatusOr<v1beta1::ContainerAllocateResponse> r =
      ContainerResponse(kind, devices, options_.device_dir);
  if (!r.ok()) return r;
  if (kind == DeviceKind::kGpu) {
    for (const std::string& m : options_.gpu_mounts) {
      const size_t colon = m.find(':');
      auto* mount = r->add_mounts();
      mount->set_host_path(m.substr(0, colon));
      mount->set_container_path(m.substr(colon + 1));
      mount->set_read_only(true);
    }
  }
  (*r->mutable_annotations())["duet.dev/devices"] =
      absl::StrCat(DeviceKindName(kind), ":", FormatIndexList(devices));
  (*r->mutable_annotations())["duet.dev/pod-uid"] = uid;
  return r;
}

void NodePlugin::CountRefusal(DeviceKind kind, const absl::Status& s) {
  std::string reason = absl::StatusCodeToString(s.code());
  for (char& c : reason) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  refusals_->Add({{"resource", KindLabel(kind)}, {"reason", reason}}).Increment();
  spdlog::warn("Allocate {} refused: {}", ResourceFor(kind).resource_name, s.ToString());
}

grpc::Status NodePlugin::Allocate(DeviceKind kind, const v1beta1::AllocateRequest& req,
                                  v1beta1::AllocateResponse* resp) {
  const absl::Time start = absl::Now();
  absl::MutexLock alloc_lock(&allocate_mu_);
  auto refuse = [&](const absl::Status& s) {
    CountRefusal(kind, s);
    return ToGrpc(s);
  };

  // 1. The ledger's holdings on this node, fresh (not the watch's view: a
  // placeholder made a moment ago must be seen).
  std::vector<v1::Holding> holdings;
  if (grpc::Status st = bridge_->ListHoldings(&holdings); !st.ok()) {
    return refuse(absl::UnavailableError(absl::StrCat(
        "duet-node cannot read the ledger from duet-bridge (", options_.bridge,
        "), so it cannot tell which devices this pod may use: ", st.error_message())));
  }

  // 2. What kubelet already served, and (when the API answers) which pods
  // are waiting to start here.
  RefreshPodResources();
  std::optional<std::vector<PendingPod>> pending;
  std::map<std::string, std::string> uid_by_name;
  if (kube_ != nullptr) {
    auto body = kube_->Get(absl::StrCat("/api/v1/pods?fieldSelector=",
                                        k8s::QueryEscape("spec.nodeName=" + options_.node_name)));
    if (body.ok()) {
      nlohmann::json list = nlohmann::json::parse(*body, nullptr, false);
      auto pods = PendingPodsFromList(list, options_.node_name);
      if (pods.ok()) {
        pending = std::move(*pods);
        uid_by_name = PodUidsByName(list);
      } else {
        spdlog::warn("Kubernetes pod list: {}", pods.status().ToString());
      }
    } else {
      spdlog::warn("Kubernetes pod list for {}: {}; matching without it", options_.node_name,
                   body.status().ToString());
    }
  }

  MatchInput state;
  state.kind = kind;
  state.claims = ClaimsOf(holdings, kind);
  for (const auto& c : state.claims) {
    if (!c.ns.empty()) uid_by_name.emplace(absl::StrCat(c.ns, "/", c.name), c.uid);
  }
  std::vector<std::pair<int, SlotUse>> new_slots;
  std::map<int, SlotUse> known_slots;
  int slots = 0;
  {
    absl::MutexLock lock(&mu_);
    state.handed_out = handed_out_[kind];
    known_slots = slot_pod_[kind];
    slots = kinds_[kind].slots;
    for (const auto& [name, resources] : served_) {
      auto uid = uid_by_name.find(name);
      auto r = resources.find(ResourceFor(kind).resource_name);
      if (uid == uid_by_name.end() || r == resources.end()) continue;
      for (const auto& c : state.claims) {
        if (c.uid == uid->second && r->second >= static_cast<int>(c.devices.size())) {
          state.served.insert(c.uid);
        }
      }
    }
  }
  state.pending = pending;

  // 3. Each container, all or nothing.
  for (const auto& creq : req.container_requests()) {
    const int n = creq.devicesids_size();
    std::vector<int> slot_numbers;
    for (const auto& id : creq.devicesids()) {
      auto s = ParseSlotId(kind, id);
      if (!s || *s >= slots) {
        return refuse(absl::InvalidArgumentError(
            absl::StrCat("unknown ", ResourceFor(kind).resource_name, " device ID \"", id, "\"")));
      }
      slot_numbers.push_back(*s);
    }
    if (n == 0) return refuse(absl::InvalidArgumentError("a container request lists no devices"));
    state.count = n;
    // kubelet passes an init container's devices on to the pod's later
    // containers under the same slot IDs: the same slots, the same devices.
    if (std::optional<Match> again =
            SameSlotsAgain(slot_numbers, known_slots, state.claims, pending)) {
      auto cresp = Answer(kind, again->devices, again->claim.uid);
      if (!cresp.ok()) return refuse(cresp.status());
      *resp->add_container_responses() = std::move(*cresp);
      spdlog::info("Allocate {} slots [{}] again -> pod {} devices {}",
                   ResourceFor(kind).resource_name, absl::StrJoin(creq.devicesids(), ","),
                   again->claim.uid, FormatIndexList(again->devices));
      continue;
    }
    absl::StatusOr<Match> m = MatchClaim(state);
    if (!m.ok() && pending.has_value()) {
      std::optional<PendingPod> bypass = PickBypassPod(kind, n, *pending, holdings);
      if (!bypass) {
        return refuse(absl::FailedPreconditionError(
            absl::StrCat("node ", options_.node_name, ": ", m.status().message(),
                         ", and no pending pod here asks ", n, " ", ResourceFor(kind).resource_name,
                         " without one")));
      }
      v1::PlacePodRequest preq;
      preq.mutable_pod()->set_uid(bypass->uid);
      preq.mutable_pod()->set_namespace_(bypass->ns);
      preq.mutable_pod()->set_name(bypass->name);
      preq.set_node(options_.node_name);
      preq.set_gpus(bypass->gpus);
      preq.set_tpus(bypass->tpus);
      preq.set_cpus(bypass->cpus);
      preq.set_memory_mib(bypass->memory_mib);
      v1::Holding placed;
      grpc::Status st = bridge_->PlacePod(preq, &placed);
      placed_->Add({{"resource", KindLabel(kind)}, {"result", st.ok() ? "placed" : "refused"}})
          .Increment();
      if (!st.ok()) {
        const std::string pod = absl::StrCat(bypass->ns, "/", bypass->name);
        if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          return refuse(absl::ResourceExhaustedError(absl::StrCat(
              "pod ", pod, " did not go through the duet scheduler and there is no room for it ",
              "on node ", options_.node_name,
              " (Slurm or the ledger holds the devices): ", st.error_message())));
        }
        return refuse(
            absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                         absl::StrCat("pod ", pod,
                                      " did not go through the duet scheduler and duet-bridge "
                                      "could not place it: ",
                                      st.error_message())));
      }
      spdlog::info("placed pod {}/{} (bypassed the duet scheduler) on {}: {}", bypass->ns,
                   bypass->name, options_.node_name, placed.ShortDebugString());
      holdings.push_back(placed);
      state.claims = ClaimsOf(holdings, kind);
      m = MatchClaim(state);
    }
    if (!m.ok()) {
      return refuse(absl::FailedPreconditionError(absl::StrCat(
          "node ", options_.node_name, ": ", m.status().message(),
          pending.has_value() ? ""
                              : "; without the Kubernetes API duet-node cannot place a pod "
                                "that bypassed the duet scheduler")));
    }
    auto cresp = Answer(kind, m->devices, m->claim.uid);
    if (!cresp.ok()) return refuse(cresp.status());
    *resp->add_container_responses() = std::move(*cresp);
    auto& given = state.handed_out[m->claim.uid];
    given.insert(given.end(), m->devices.begin(), m->devices.end());
    std::sort(slot_numbers.begin(), slot_numbers.end());
    for (size_t i = 0; i < slot_numbers.size(); ++i) {
      new_slots.emplace_back(slot_numbers[i], SlotUse{m->claim.uid, m->devices[i]});
      known_slots[slot_numbers[i]] = SlotUse{m->claim.uid, m->devices[i]};
    }
    spdlog::info("Allocate {} slots [{}] -> pod {} ({}{}) devices {}",
                 ResourceFor(kind).resource_name, absl::StrJoin(creq.devicesids(), ","),
                 m->claim.uid, m->claim.ns.empty() ? "" : m->claim.ns + "/", m->claim.name,
                 FormatIndexList(m->devices));
  }

  // 4. Commit the bookkeeping (health avoids these slots from now on).
  {
    absl::MutexLock lock(&mu_);
    handed_out_[kind] = state.handed_out;
    for (const auto& [slot, use] : new_slots) slot_pod_[kind][slot] = use;
    RecomputeLocked();
  }
  allocations_->Add({{"resource", KindLabel(kind)}}).Increment(req.container_requests_size());
  allocate_seconds_
      ->Add({{"resource", KindLabel(kind)}},
            prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15})
      .Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return grpc::Status::OK;
}

}  // namespace node
}  // namespace duet
