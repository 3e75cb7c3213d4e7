#include "bridge/server/watch_metrics.h"

#include "common/metrics/metrics.h"

namespace duet {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

}  // namespace

std::vector<MetricFamily> PodWatchFamilies(const k8s::PodWatchStats& s) {
  std::vector<MetricFamily> out;
  MetricFamily rel = NewFamily("duet_pod_releases_total",
                               "Pod holdings (placeholders) released by the pod watch, by reason",
                               MetricType::Counter);
  AddValue(&rel, {{"reason", "deleted"}}, static_cast<double>(s.released_deleted));
  AddValue(&rel, {{"reason", "terminal"}}, static_cast<double>(s.released_terminal));
  AddValue(&rel, {{"reason", "orphaned"}}, static_cast<double>(s.released_orphaned));
  out.push_back(std::move(rel));
  MetricFamily fail = NewFamily("duet_pod_release_failures_total",
                                "Pod holding releases that failed and were kept for a retry",
                                MetricType::Counter);
  AddValue(&fail, {}, static_cast<double>(s.release_failures));
  out.push_back(std::move(fail));
  MetricFamily sweeps = NewFamily("duet_pod_sweeps_total",
                                  "Sweeps of the ledger against the pod view, by result",
                                  MetricType::Counter);
  AddValue(&sweeps, {{"result", "done"}}, static_cast<double>(s.sweeps));
  AddValue(&sweeps, {{"result", "skipped"}}, static_cast<double>(s.sweeps_skipped));
  out.push_back(std::move(sweeps));
  MetricFamily pods = NewFamily("duet_pod_watch_pods", "Pods in the pod watch's view",
                                MetricType::Gauge);
  AddValue(&pods, {}, static_cast<double>(s.pods));
  out.push_back(std::move(pods));
  return out;
}

std::vector<MetricFamily> InformerFamilies(
    const std::vector<std::pair<std::string, k8s::InformerStats>>& by_resource) {
  MetricFamily events = NewFamily("duet_k8s_watch_events_total",
                                  "Kubernetes watch events applied, by resource",
                                  MetricType::Counter);
  MetricFamily relists = NewFamily("duet_k8s_watch_relists_total",
                                   "Kubernetes relists after the first list (410 Gone, bad frames)",
                                   MetricType::Counter);
  MetricFamily failures = NewFamily("duet_k8s_watch_failures_total",
                                    "Failed Kubernetes list or watch attempts, by resource",
                                    MetricType::Counter);
  for (const auto& [resource, s] : by_resource) {
    AddValue(&events, {{"resource", resource}}, static_cast<double>(s.events));
    AddValue(&relists, {{"resource", resource}},
             static_cast<double>(s.lists > 0 ? s.lists - 1 : 0));
    AddValue(&failures, {{"resource", resource}}, static_cast<double>(s.failures));
  }
  return {std::move(events), std::move(relists), std::move(failures)};
}

std::vector<MetricFamily> EventFamilies(const k8s::EventRecorderStats& s) {
  MetricFamily total = NewFamily("duet_k8s_events_total", "Kubernetes Events recorded, by result",
                                 MetricType::Counter);
  AddValue(&total, {{"result", "posted"}}, static_cast<double>(s.posted));
  AddValue(&total, {{"result", "failed"}}, static_cast<double>(s.failed));
  AddValue(&total, {{"result", "deduplicated"}}, static_cast<double>(s.deduplicated));
  AddValue(&total, {{"result", "dropped"}}, static_cast<double>(s.dropped));
  MetricFamily queued = NewFamily("duet_k8s_events_queued", "Kubernetes Events waiting to be posted",
                                  MetricType::Gauge);
  AddValue(&queued, {}, static_cast<double>(s.queued));
  return {std::move(total), std::move(queued)};
}

}  // namespace duet
