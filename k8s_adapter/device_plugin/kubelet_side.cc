#include "k8s_adapter/device_plugin/kubelet_side.h"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "k8s/deviceplugin/v1beta1/deviceplugin.grpc.pb.h"
#include "k8s_adapter/device_plugin/allocation.h"
#include "k8s_adapter/device_plugin/pod_resources.h"
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
// The v1beta1.DevicePlugin service for one resource. Thin: KubeletSide and
// the Allocator do the work. One instance per server start (a gRPC service
// registers with one server only).

class KubeletSide::Service final : public v1beta1::DevicePlugin::Service {
 public:
  Service(KubeletSide* side, DeviceKind kind) : side_(side), kind_(kind) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* resp) override {
    resp->set_pre_start_required(false);
    resp->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    return side_->ListAndWatch(kind_, ctx, writer);
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
    return side_->allocator_->Allocate(kind_, *req, resp);
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  KubeletSide* const side_;
  const DeviceKind kind_;
};

// ---------------------------------------------------------------------------

KubeletSide::KubeletSide(const NodePluginOptions& options, SlotHealth* health,
                         Allocator* allocator,
                         prometheus::Family<prometheus::Counter>* registrations_total)
    : options_(options),
      health_(health),
      allocator_(allocator),
      registrations_total_(registrations_total) {}

KubeletSide::~KubeletSide() { Stop(); }

void KubeletSide::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void KubeletSide::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  for (auto& [kind, server] : servers_) {
    if (server == nullptr) continue;
    server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    server->Wait();
    ::unlink(absl::StrCat(options_.plugin_dir, "/", ResourceFor(kind).endpoint).c_str());
  }
  servers_.clear();
  services_.clear();
}

grpc::Status KubeletSide::ListAndWatch(
    DeviceKind kind, grpc::ServerContext* ctx,
    grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  const uint64_t epoch = health_->Epoch(kind);
  uint64_t sent = 0;
  while (true) {
    v1beta1::ListAndWatchResponse resp;
    const SlotHealth::Next next = health_->WaitForList(kind, epoch, &sent, &resp);
    if (next == SlotHealth::Next::kStopped) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "duet-node is restarting the plugin");
    }
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (next == SlotHealth::Next::kSend && !writer->Write(resp)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "kubelet closed the stream");
    }
  }
}

void KubeletSide::RefreshPodResources() {
  if (std::optional<KubeletGiven> given = ListKubeletGiven(options_.pod_resources_socket)) {
    health_->SetKubeletGiven(*std::move(given));
  }
}

// ---------------------------------------------------------------------------
// The kubelet thread: (re-)serving, registration, PodResources.

void KubeletSide::Loop() {
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
    if (stopping_) break;
    const std::optional<std::map<DeviceKind, int>> counts = health_->SlotCounts();
    if (!counts) break;
    std::vector<DeviceKind> active;
    for (const auto& [kind, slots] : *counts) {
      if (slots > 0 || servers_.count(kind)) active.push_back(kind);
    }
    // Which kubelet is there now: a restarted kubelet has a new kubelet.sock.
    const std::string kubelet_id = SocketIdentity(kubelet_sock);
    for (DeviceKind kind : active) {
      const std::string sock = absl::StrCat(options_.plugin_dir, "/", ResourceFor(kind).endpoint);
      std::string registered_with = kubelet_id_[kind];
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
        kubelet_id_[kind] = kubelet_id;
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

void KubeletSide::RestartServer(DeviceKind kind) {
  const std::string sock = absl::StrCat(options_.plugin_dir, "/", ResourceFor(kind).endpoint);
  if (servers_[kind] != nullptr) {
    health_->EndStreams(kind);  // ends the old server's ListAndWatch streams
    servers_[kind]->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    servers_[kind]->Wait();
    servers_[kind].reset();
  }
  kubelet_id_[kind].clear();
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

absl::Status KubeletSide::Register(DeviceKind kind) {
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

}  // namespace node
}  // namespace duet
