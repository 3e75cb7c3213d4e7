#pragma once

// Metric families, made at scrape time, of duet-bridge's Kubernetes side:
// the pod watch, the informers (Node and Pod watches) and the event recorder.

#include <string>
#include <utility>
#include <vector>

#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/informer.h"
#include "k8s_adapter/reconcile/pod_watch.h"
#include "prometheus/metric_family.h"

namespace duet {

// duet_pod_releases_total{reason}, duet_pod_release_failures_total,
// duet_pod_sweeps_total, duet_pod_watch_pods.
std::vector<prometheus::MetricFamily> PodWatchFamilies(const k8s::PodWatchStats& stats);
// duet_k8s_watch_events_total{resource}, duet_k8s_watch_relists_total{resource}
// (lists after the first), duet_k8s_watch_failures_total{resource}.
std::vector<prometheus::MetricFamily> InformerFamilies(
    const std::vector<std::pair<std::string, k8s::InformerStats>>& by_resource);
// duet_k8s_events_total{result}, duet_k8s_events_queued.
std::vector<prometheus::MetricFamily> EventFamilies(const k8s::EventRecorderStats& stats);

}  // namespace duet
