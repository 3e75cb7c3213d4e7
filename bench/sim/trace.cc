#include "bench/sim/trace.h"

#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace duet::sim {
namespace {

// Reads a CSV file with a header row line by line. The trace has no quoted
// fields, so a plain split on ',' is exact.
class CsvReader {
  static constexpr size_t kAbsent = ~size_t{0};

 public:
  // `columns` must be in the header; `optional` ones read as empty where the
  // file lacks them (openb_pod_list_multigpu50.csv has no gpu_spec or qos).
  absl::Status Open(const std::string& path, const std::vector<std::string>& columns,
                    const std::vector<std::string>& optional = {}) {
    path_ = path;
    in_.open(path);
    if (!in_) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    std::string header;
    if (!std::getline(in_, header)) return absl::InvalidArgumentError(absl::StrCat(path, ": empty"));
    std::vector<std::string> names = absl::StrSplit(absl::StripTrailingAsciiWhitespace(header), ',');
    for (const std::string& c : columns) {
      size_t i = 0;
      while (i < names.size() && names[i] != c) ++i;
      if (i == names.size()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": no column \"", c, "\""));
      }
      index_.push_back(i);
    }
    for (const std::string& c : optional) {
      size_t i = 0;
      while (i < names.size() && names[i] != c) ++i;
      index_.push_back(i == names.size() ? kAbsent : i);
    }
    return absl::OkStatus();
  }

  // Next row's requested columns, in the order given to Open. False at end.
  bool Next(std::vector<absl::string_view>* out, absl::Status* status) {
    while (std::getline(in_, line_)) {
      ++line_no_;
      absl::string_view row = absl::StripTrailingAsciiWhitespace(line_);
      if (row.empty()) continue;
      fields_ = absl::StrSplit(row, ',');
      out->clear();
      for (size_t i : index_) {
        if (i == kAbsent) {
          out->push_back(absl::string_view());
          continue;
        }
        if (i >= fields_.size()) {
          *status = Error("too few fields");
          return false;
        }
        out->push_back(fields_[i]);
      }
      return true;
    }
    return false;
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ":", line_no_ + 1, ": ", what));
  }

 private:
  std::string path_;
  std::ifstream in_;
  std::string line_;
  std::vector<absl::string_view> fields_;
  std::vector<size_t> index_;
  size_t line_no_ = 0;
};

template <typename T>
bool ParseNumber(absl::string_view s, T* out) {
  return absl::SimpleAtoi(s, out);
}

}  // namespace

absl::Status ReadNodes(const std::string& path,
                       const std::function<absl::Status(NodeSpec)>& fn) {
  CsvReader csv;
  absl::Status s = csv.Open(path, {"sn", "cpu_milli", "memory_mib", "gpu", "model"});
  if (!s.ok()) return s;
  std::vector<absl::string_view> f;
  while (csv.Next(&f, &s)) {
    NodeSpec spec;
    spec.name = std::string(f[0]);
    uint64_t cpu_milli = 0;
    uint32_t gpus = 0;
    if (!ParseNumber(f[1], &cpu_milli) || !ParseNumber(f[2], &spec.memory_mib) ||
        !ParseNumber(f[3], &gpus)) {
      return csv.Error("bad number");
    }
    spec.cpus = static_cast<uint32_t>(cpu_milli / 1000);
    for (uint32_t i = 0; i < gpus; ++i) {
      DeviceSpec d;
      d.kind = DeviceKind::kGpu;
      d.index = i;
      d.id = absl::StrCat(spec.name, "-gpu", i);
      d.model = std::string(f[4]);
      d.capacity_milli = kWholeDevice;
      spec.devices.push_back(std::move(d));
    }
    s = fn(std::move(spec));
    if (!s.ok()) return s;
  }
  return s;
}

absl::Status ReadPods(const std::string& path, const std::function<absl::Status(TracePod)>& fn) {
  CsvReader csv;
  absl::Status s = csv.Open(
      path, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}, {"gpu_spec", "qos"});
  if (!s.ok()) return s;
  std::vector<absl::string_view> f;
  while (csv.Next(&f, &s)) {
    TracePod pod;
    pod.name = std::string(f[0]);
    uint32_t num_gpu = 0;
    uint32_t gpu_milli = 0;
    placement::PodRequest& r = pod.request;
    if (!ParseNumber(f[1], &r.cpu_milli) || !ParseNumber(f[2], &r.memory_mib) ||
        !ParseNumber(f[3], &num_gpu) || !ParseNumber(f[4], &gpu_milli)) {
      return csv.Error("bad number");
    }
    r.kind = DeviceKind::kGpu;
    r.count = num_gpu;
    r.milli = num_gpu == 1 && gpu_milli > 0 && gpu_milli < kWholeDevice ? gpu_milli : kWholeDevice;
    if (!f[5].empty()) {
      for (absl::string_view m : absl::StrSplit(f[5], '|', absl::SkipEmpty())) {
        r.models.emplace_back(m);
      }
    }
    pod.qos = std::string(f[6]);
    s = placement::ValidatePodRequest(r);
    if (!s.ok()) return csv.Error(s.message());
    s = fn(std::move(pod));
    if (!s.ok()) return s;
  }
  return s;
}

}  // namespace duet::sim
