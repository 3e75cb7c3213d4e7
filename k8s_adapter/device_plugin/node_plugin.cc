#include "k8s_adapter/device_plugin/node_plugin.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "common/metrics/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace node {

NodePlugin::NodePlugin(const NodePluginOptions& options, k8s::KubeClient* kube,
                       std::shared_ptr<grpc::ChannelCredentials> bridge_credentials)
    : options_(options), registry_(std::make_shared<prometheus::Registry>()) {
  AllocatorMetrics am;
  am.allocations =
      &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_allocations_total",
                      "Containers given devices by Allocate, by resource");
  am.refusals =
      &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_allocation_refusals_total",
                      "Allocate calls refused, by resource and reason (status code)");
  am.placed = &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_placed_pods_total",
                              "Placeholders asked on the spot for pods that bypassed the duet "
                              "scheduler, by resource and result");
  auto* registrations_total =
      &RegisterFamily(prometheus::BuildCounter(), *registry_, "duet_node_registrations_total",
                      "Registrations with kubelet, by resource and result");
  auto* slots = &RegisterFamily(prometheus::BuildGauge(), *registry_, "duet_node_slots",
                                "Slots advertised to kubelet, by resource and health");
  am.allocate_seconds =
      &RegisterFamily(prometheus::BuildHistogram(), *registry_, "duet_node_allocate_seconds",
                      "Allocate latency, by resource");
  auto* watch_restarts = &RegisterFamily(prometheus::BuildCounter(), *registry_,
                                         "duet_node_bridge_watch_restarts_total",
                                         "Times the bridge's WatchNodes stream ended and was reopened")
                              .Add({});
  auto* watch_connected =
      &RegisterFamily(prometheus::BuildGauge(), *registry_, "duet_node_bridge_watch_connected",
                      "1 while the bridge's WatchNodes stream delivers events")
           .Add({});

  health_ = std::make_unique<SlotHealth>(slots);
  bridge_ = std::make_unique<BridgeLink>(options_, std::move(bridge_credentials), watch_restarts,
                                         watch_connected);
  allocator_ = std::make_unique<Allocator>(options_, kube, bridge_.get(), health_.get(), am);
  kubelet_ = std::make_unique<KubeletSide>(options_, health_.get(), allocator_.get(),
                                           registrations_total);
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
  if (!options.step_agent_socket.empty()) {
    BridgeLink* link = p->bridge_.get();
    auto agent = StepAgent::Start(
        options.step_agent_socket, [link](const StepCall& c) { return link->ForwardStep(c); },
        options.bridge_timeout);
    if (!agent.ok()) return agent.status();
    p->step_agent_ = *std::move(agent);
  }
  SlotHealth* health = p->health_.get();
  p->bridge_->StartWatch([health](const v1::Node* node) { health->SetNode(node); });
  p->kubelet_->Start();
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
  // The step agent first: its calls use the bridge link.
  if (step_agent_ != nullptr) step_agent_->Stop();
  // Health: it ends the ListAndWatch streams and the kubelet loop.
  health_->Stop();
  bridge_->Stop();
  kubelet_->Stop();
  exposer_.reset();
}

int NodePlugin::registrations() const { return kubelet_->registrations(); }

bool NodePlugin::have_node() const { return health_->have_node(); }

int NodePlugin::metrics_port() const {
  if (exposer_ == nullptr) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string NodePlugin::RenderMetrics() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace node
}  // namespace duet
