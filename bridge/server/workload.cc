#include "bridge/server/workload.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "k8s_adapter/common/pod_request.h"
#include "k8s_adapter/extender/types.h"

namespace duet {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

}  // namespace

bool ObserveBoundPod(placement::WorkloadModel* model, const Ledger& ledger,
                     const nlohmann::json& pod, absl::Time now) {
  const nlohmann::json* spec = k8s::Field(pod, "spec");
  const nlohmann::json* node = spec == nullptr ? nullptr : k8s::Field(*spec, "nodeName");
  if (node == nullptr || !node->is_string() || ledger.GetNode(node->get<std::string>()) == nullptr) {
    return false;
  }
  const nlohmann::json* md = k8s::Field(pod, "metadata");
  const nlohmann::json* uid = md == nullptr ? nullptr : k8s::Field(*md, "uid");
  if (uid == nullptr || !uid->is_string() || uid->get_ref<const std::string&>().empty()) {
    return false;
  }
  absl::StatusOr<placement::PodRequest> req = extender::ParsePodRequest(pod);
  if (!req.ok()) return false;
  return model->Observe(absl::StrCat("pod/", uid->get_ref<const std::string&>()), *req, now);
}

bool ObserveSlurmJob(placement::WorkloadModel* model, const Ledger& ledger,
                     const SlurmJobInfo& job, absl::Time now) {
  for (const SlurmJobNodeDevices& d : job.devices) {
    if (d.gpus.empty() && d.tpus.empty()) continue;
    if (ledger.GetNode(d.node) == nullptr) continue;
    placement::PodRequest r;
    r.kind = d.gpus.empty() ? DeviceKind::kTpu : DeviceKind::kGpu;
    r.count = static_cast<uint32_t>(d.gpus.empty() ? d.tpus.size() : d.gpus.size());
    const size_t nodes = job.devices.size();
    r.cpu_milli = uint64_t{job.cpus} * 1000 / nodes;
    r.memory_mib = job.memory_mib;
    return model->Observe(absl::StrCat("slurm/", job.job_id), r, now);
  }
  return false;
}

std::vector<MetricFamily> WorkloadFamilies(const placement::WorkloadModel::Stats& s) {
  std::vector<MetricFamily> out;
  MetricFamily shapes = NewFamily(
      "duet_workload_shapes", "Shapes in the learned workload: tracked, and exported to scoring",
      MetricType::Gauge);
  AddValue(&shapes, {{"set", "tracked"}}, static_cast<double>(s.tracked));
  AddValue(&shapes, {{"set", "exported"}}, static_cast<double>(s.exported));
  out.push_back(std::move(shapes));
  const struct {
    const char* name;
    const char* help;
    MetricType type;
    double value;
  } singles[] = {
      {"duet_workload_coverage",
       "Share of the learned workload's (decayed) arrivals the exported shapes carry",
       MetricType::Gauge, s.coverage},
      {"duet_workload_arrivals_total", "Pods and Slurm jobs counted in the learned workload",
       MetricType::Counter, static_cast<double>(s.arrivals)},
      {"duet_workload_duplicates_total",
       "Sightings of a pod or job already counted in the learned workload", MetricType::Counter,
       static_cast<double>(s.duplicates)},
      {"duet_workload_evictions_total", "Shapes dropped from the learned workload to keep its bound",
       MetricType::Counter, static_cast<double>(s.evictions)},
  };
  for (const auto& m : singles) {
    MetricFamily f = NewFamily(m.name, m.help, m.type);
    AddValue(&f, {}, m.value);
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace duet
