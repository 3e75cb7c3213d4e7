#include "k8s_adapter/device_plugin/pod_resources.h"

#include <sys/stat.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "k8s/podresources/v1/podresources.grpc.pb.h"
#include "k8s_adapter/device_plugin/allocation.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace node {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::Status CheckSoleAdvertiser(const std::string& pod_resources_socket) {
  if (pod_resources_socket.empty() || !Exists(pod_resources_socket)) {
    spdlog::warn("no PodResources socket ({}): cannot check that duet-node is the only device "
                 "plugin for its resources",
                 pod_resources_socket.empty() ? "not configured" : pod_resources_socket);
    return absl::OkStatus();
  }
  auto channel = grpc::CreateChannel(absl::StrCat("unix:", pod_resources_socket),
                                     grpc::InsecureChannelCredentials());
  auto stub = ::v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  ::v1::AllocatableResourcesResponse resp;
  grpc::Status st = stub->GetAllocatableResources(&ctx, ::v1::AllocatableResourcesRequest(), &resp);
  if (!st.ok()) {
    spdlog::warn("PodResources GetAllocatableResources: {}: cannot check that duet-node is the "
                 "only device plugin for its resources",
                 st.error_message());
    return absl::OkStatus();
  }
  for (DeviceKind kind : kAllKinds) {
    std::vector<std::string> foreign;
    for (const auto& d : resp.devices()) {
      if (d.resource_name() != ResourceFor(kind).resource_name) continue;
      for (const auto& id : d.device_ids()) {
        if (!ParseSlotId(kind, id)) foreign.push_back(id);
      }
    }
    if (!foreign.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another device plugin already advertises ", ResourceFor(kind).resource_name,
          " on this node (kubelet lists devices ", absl::StrJoin(foreign, ", "),
          ", which are not duet-node's); two plugins for one resource on a kubelet is unsafe. "
          "Run duet-node only where it is the sole advertiser: on GKE, a GPU node pool created "
          "with the node label gke-no-default-nvidia-gpu-device-plugin=true "
          "(charts/duet/README.md, \"One advertiser per resource\")"));
    }
  }
  return absl::OkStatus();
}

std::optional<KubeletGiven> ListKubeletGiven(const std::string& pod_resources_socket) {
  if (pod_resources_socket.empty() || !Exists(pod_resources_socket)) return std::nullopt;
  auto channel = grpc::CreateChannel(absl::StrCat("unix:", pod_resources_socket),
                                     grpc::InsecureChannelCredentials());
  auto stub = ::v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  ::v1::ListPodResourcesRequest req;
  ::v1::ListPodResourcesResponse resp;
  grpc::Status st = stub->List(&ctx, req, &resp);
  if (!st.ok()) {
    spdlog::debug("PodResources List: {}", st.error_message());
    return std::nullopt;
  }
  KubeletGiven given;
  for (const auto& pod : resp.pod_resources()) {
    const std::string key = absl::StrCat(pod.namespace_(), "/", pod.name());
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        for (DeviceKind kind : kAllKinds) {
          if (d.resource_name() != ResourceFor(kind).resource_name) continue;
          for (const auto& id : d.device_ids()) {
            if (auto slot = ParseSlotId(kind, id)) given.allocated[kind].insert(*slot);
          }
          given.served[key][d.resource_name()] += d.device_ids_size();
        }
      }
    }
  }
  return given;
}

}  // namespace node
}  // namespace duet
