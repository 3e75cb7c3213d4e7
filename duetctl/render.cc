#include "duetctl/render.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bridge/api/convert.h"
#include "bridge/ledger/usage.h"
#include "common/enum_name.h"
#include "google/protobuf/util/time_util.h"

namespace duet::ctl {
namespace {

constexpr int64_t kWhole = 1000;
constexpr uint32_t kBatchStep = 0xfffffffb;
constexpr uint32_t kExternStep = 0xfffffffc;
constexpr uint32_t kInteractiveStep = 0xfffffffa;

enum class HolderClass { kSlurm, kPods, kNone };

HolderClass ClassOf(const v1::Owner& owner) {
  switch (owner.kind_case()) {
    case v1::Owner::kSlurmJob:
    case v1::Owner::kSlurmStep:
      return HolderClass::kSlurm;
    case v1::Owner::kPod:
    case v1::Owner::kPlaceholder:
    case v1::Owner::kClaim:
    case v1::Owner::kLend:
    case v1::Owner::kGangSlot:
      return HolderClass::kPods;
    case v1::Owner::KIND_NOT_SET:
      break;
  }
  return HolderClass::kNone;
}

const char* ClassText(HolderClass c) {
  static constexpr const char* kNames[] = {"slurm", "pods"};  // kNone: unknown
  return EnumName(c, kNames);
}

int64_t Capacity(const v1::Device& d) {
  return d.capacity_milli() == 0 ? kWhole : static_cast<int64_t>(d.capacity_milli());
}

struct DeviceCount {
  int64_t slurm = 0;  // milli-devices
  int64_t pods = 0;
};

// Counted as the bridge counts (owner groups, shares over the device's
// capacity: bridge/ledger/usage.h), on the holders the answer lists.
DeviceCount CountDevice(const v1::Device& d) {
  const uint32_t cap = static_cast<uint32_t>(Capacity(d));
  std::vector<DeviceUse> uses;
  uses.reserve(static_cast<size_t>(d.holders_size()));
  for (const v1::DeviceHolder& h : d.holders()) {
    absl::StatusOr<Owner> owner = FromProto(h.owner());
    if (!owner.ok()) continue;  // no owner kind: counts for nobody
    uses.push_back(
        {std::make_shared<const Owner>(*std::move(owner)), h.milli() == 0 ? cap : h.milli()});
  }
  const ClassUse use = UseByClass(uses, cap);
  return {duet::MilliDevices(use.slurm_milli, cap), duet::MilliDevices(use.pod_milli, cap)};
}

// Display width of UTF-8 text: code points, not bytes ("…" is one column).
size_t DisplayWidth(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xc0) != 0x80) ++n;
  }
  return n;
}

// The code point of the UTF-8 sequence at text[i] in *cp, and the
// sequence's length; 0 when the bytes there are not well-formed UTF-8
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
size_t DecodeUtf8(std::string_view text, size_t i, char32_t* cp) {
  const unsigned char lead = static_cast<unsigned char>(text[i]);
  size_t len;
  char32_t c;
  char32_t min;
  if (lead < 0x80) {
    *cp = lead;
    return 1;
  } else if ((lead & 0xe0) == 0xc0) {
    len = 2, c = lead & 0x1f, min = 0x80;
  } else if ((lead & 0xf0) == 0xe0) {
    len = 3, c = lead & 0x0f, min = 0x800;
  } else if ((lead & 0xf8) == 0xf0) {
    len = 4, c = lead & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (text.size() - i < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    c = (c << 6) | (b & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
  *cp = c;
  return len;
}

// Code points past ASCII that a terminal acts on or does not show: C1
// controls (0x9b is CSI where 8-bit controls are honoured), the soft hyphen,
// zero-width characters, line and paragraph separators, and the
// bidirectional marks, embeddings, overrides and isolates that reorder what
// follows them ("Trojan Source").
bool Invisible(char32_t c) {
  return (c >= 0x80 && c <= 0x9f) || c == 0xad || (c >= 0x200b && c <= 0x200f) ||
         (c >= 0x2028 && c <= 0x202e) || (c >= 0x2060 && c <= 0x206f) || c == 0xfeff ||
         (c >= 0xfff9 && c <= 0xfffb);
}

// Left-aligned columns, three spaces apart, no trailing spaces. Every cell is
// printed through Printable: cells hold names and reasons from the cluster.
std::string FormatTable(std::vector<std::vector<std::string>> rows) {
  for (auto& row : rows) {
    for (std::string& cell : row) cell = Printable(cell);
  }
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], DisplayWidth(row[i]));
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      out += row[i];
      if (i + 1 < row.size()) out.append(widths[i] - DisplayWidth(row[i]) + 3, ' ');
    }
    out += '\n';
  }
  return out;
}

std::string ShortUid(const std::string& uid) {
  if (DisplayWidth(uid) <= 8) return uid;
  return uid.substr(0, 8) + "\u2026";
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

std::string StateJson(v1::NodeState state) {
  static constexpr const char* kNames[] = {nullptr, "ready", "cordoned", "not_ready", "gone"};
  return EnumName(state, kNames);
}

// Whole devices print as integers, shares as decimals.
Json CountJson(int64_t milli) {
  if (milli % kWhole == 0) return Json(milli / kWhole);
  return Json(static_cast<double>(milli) / kWhole);
}

Json OwnerJson(const v1::Owner& owner) {
  Json j = Json::object();
  switch (owner.kind_case()) {
    case v1::Owner::kSlurmJob:
      j["kind"] = "slurm_job";
      j["job_id"] = owner.slurm_job().job_id();
      break;
    case v1::Owner::kSlurmStep:
      j["kind"] = "slurm_step";
      j["job_id"] = owner.slurm_step().job_id();
      j["step_id"] = owner.slurm_step().step_id();
      break;
    case v1::Owner::kPod:
      j["kind"] = "pod";
      j["uid"] = owner.pod().uid();
      j["namespace"] = owner.pod().namespace_();
      j["name"] = owner.pod().name();
      break;
    case v1::Owner::kPlaceholder:
      j["kind"] = "placeholder";
      j["job_id"] = owner.placeholder().job_id();
      j["pod_uid"] = owner.placeholder().pod_uid();
      break;
    case v1::Owner::kClaim:
      j["kind"] = "claim";
      j["job_id"] = owner.claim().job_id();
      j["uid"] = owner.claim().uid();
      j["namespace"] = owner.claim().namespace_();
      j["name"] = owner.claim().name();
      break;
    case v1::Owner::kLend:
      j["kind"] = "lend";
      j["job_id"] = owner.lend().job_id();
      j["node"] = owner.lend().node();
      break;
    case v1::Owner::kGangSlot:
      j["kind"] = "gang_slot";
      j["job_id"] = owner.gang_slot().job_id();
      j["gang"] = owner.gang_slot().gang();
      j["slot"] = owner.gang_slot().slot();
      break;
    case v1::Owner::KIND_NOT_SET:
      j["kind"] = "unknown";
      break;
  }
  return j;
}

// Notes uid -> "ns/name" when `o` is a named pod, so a placeholder can name
// its pod.
void NotePodName(const v1::Owner& o, std::map<std::string, std::string>* names) {
  if (o.kind_case() == v1::Owner::kPod && !o.pod().name().empty()) {
    (*names)[o.pod().uid()] = o.pod().namespace_().empty()
                                  ? o.pod().name()
                                  : absl::StrCat(o.pod().namespace_(), "/", o.pod().name());
  }
}

// The pod names among the holdings' owners.
std::map<std::string, std::string> PodNames(const v1::ListHoldingsResponse& response) {
  std::map<std::string, std::string> names;
  for (const v1::Holding& h : response.holdings()) NotePodName(h.owner(), &names);
  return names;
}

// The pod names among the holders of the node's devices.
std::map<std::string, std::string> PodNames(const v1::Node& node) {
  std::map<std::string, std::string> names;
  for (const v1::Device& d : node.devices()) {
    for (const v1::DeviceHolder& h : d.holders()) NotePodName(h.owner(), &names);
  }
  return names;
}

// Pointers to `items`, stably sorted by `less` on the items.
template <typename T, typename Less>
std::vector<const T*> SortedPointers(const google::protobuf::RepeatedPtrField<T>& items,
                                     Less less) {
  std::vector<const T*> sorted;
  for (const T& item : items) sorted.push_back(&item);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const T* a, const T* b) { return less(*a, *b); });
  return sorted;
}

// Devices (v1::Device, v1::HeldDevice) by kind, then index.
template <typename D>
bool KindIndexLess(const D& a, const D& b) {
  return std::make_tuple(static_cast<int>(a.kind()), a.index()) <
         std::make_tuple(static_cast<int>(b.kind()), b.index());
}

bool NodeLess(const v1::Holding& a, const v1::Holding& b) { return a.node() < b.node(); }
bool NameLess(const v1::Node& a, const v1::Node& b) { return a.name() < b.name(); }

// Adds the counts of `t` to the tally of its kind.
void AddToKind(const ModelTally& t, std::map<int, ModelTally>* by_kind) {
  ModelTally& k = (*by_kind)[t.kind];
  k.kind = t.kind;
  k.total += t.total;
  k.slurm += t.slurm;
  k.pods += t.pods;
  k.free += t.free;
}

// The fields NodesJson and NodeJson both start with.
Json NodeHeadJson(const v1::Node& node) {
  Json j = Json::object();
  j["name"] = node.name();
  j["state"] = StateJson(node.state());
  if (!node.slurm_state().empty()) {
    j["slurm_state"] = node.slurm_state();
    j["slurm_reason"] = node.slurm_reason();
  }
  j["pool"] = node.pool();
  j["zone"] = node.zone();
  return j;
}

std::string PodNameFor(const v1::Owner& owner, const std::map<std::string, std::string>& names) {
  if (owner.kind_case() != v1::Owner::kPlaceholder) return "";
  auto it = names.find(owner.placeholder().pod_uid());
  return it == names.end() ? "" : it->second;
}

std::string MilliText(int64_t milli) { return absl::StrCat(milli, "m"); }

}  // namespace

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char ch = text[i];
    char32_t cp = 0;
    const size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) {  // not UTF-8: the byte itself, visibly
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(ch));
      ++i;
      continue;
    }
    if (ch == '\\') {
      out += "\\\\";
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned>(cp));
    } else if (Invisible(cp)) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned>(cp));
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string KindText(v1::DeviceKind kind) {
  static constexpr const char* kNames[] = {nullptr, "gpu", "tpu"};
  return EnumName(kind, kNames, "-");
}

std::string StateText(v1::NodeState state) {
  static constexpr const char* kNames[] = {nullptr, "Ready", "Cordoned", "NotReady", "Gone"};
  return EnumName(state, kNames, "Unknown");
}

std::string MilliDevices(int64_t milli) {
  const bool negative = milli < 0;
  if (negative) milli = -milli;
  std::string out = absl::StrCat(negative ? "-" : "", milli / kWhole);
  int64_t frac = milli % kWhole;
  if (frac != 0) {
    std::string digits = absl::StrCat(frac + kWhole).substr(1);  // zero-padded to 3
    while (!digits.empty() && digits.back() == '0') digits.pop_back();
    absl::StrAppend(&out, ".", digits);
  }
  return out;
}

std::string OwnerText(const v1::Owner& owner, const std::string& pod_name) {
  switch (owner.kind_case()) {
    case v1::Owner::kSlurmJob:
      return absl::StrCat("job ", owner.slurm_job().job_id());
    case v1::Owner::kSlurmStep: {
      const uint32_t step = owner.slurm_step().step_id();
      std::string step_text;
      if (step == kBatchStep) {
        step_text = "batch";
      } else if (step == kExternStep) {
        step_text = "extern";
      } else if (step == kInteractiveStep) {
        step_text = "interactive";
      } else {
        step_text = absl::StrCat(step);
      }
      return absl::StrCat("job ", owner.slurm_step().job_id(), " step ", step_text);
    }
    case v1::Owner::kPod: {
      const v1::PodRef& p = owner.pod();
      if (p.name().empty()) return absl::StrCat("pod uid ", ShortUid(p.uid()));
      if (p.namespace_().empty()) return absl::StrCat("pod ", p.name());
      return absl::StrCat("pod ", p.namespace_(), "/", p.name());
    }
    case v1::Owner::kPlaceholder:
      return absl::StrCat(
          "placeholder job ", owner.placeholder().job_id(), " (pod ",
          pod_name.empty() ? absl::StrCat("uid ", ShortUid(owner.placeholder().pod_uid()))
                           : pod_name,
          ")");
    case v1::Owner::kClaim: {
      const v1::ClaimRef& c = owner.claim();
      const std::string who = c.name().empty()
                                  ? absl::StrCat("uid ", ShortUid(c.uid()))
                                  : absl::StrCat(c.namespace_(), "/", c.name());
      return absl::StrCat("claim ", who, " (lend job ", c.job_id(), ")");
    }
    case v1::Owner::kLend:
      return absl::StrCat("lent to kubernetes (lend job ", owner.lend().job_id(), ")");
    case v1::Owner::kGangSlot:
      return absl::StrCat("gang ", owner.gang_slot().gang(), " slot ", owner.gang_slot().slot(),
                          " (gang job ", owner.gang_slot().job_id(), ")");
    case v1::Owner::KIND_NOT_SET:
      break;
  }
  return "unknown owner";
}

std::string DevicesText(const google::protobuf::RepeatedPtrField<v1::HeldDevice>& devices) {
  const std::vector<const v1::HeldDevice*> sorted =
      SortedPointers(devices, KindIndexLess<v1::HeldDevice>);
  auto whole = [](const v1::HeldDevice* d) { return d->milli() == 0 || d->milli() >= kWhole; };
  std::vector<std::string> items;
  for (size_t i = 0; i < sorted.size();) {
    const v1::HeldDevice* d = sorted[i];
    std::string item = absl::StrCat(KindText(d->kind()), d->index());
    if (!whole(d)) {
      absl::StrAppend(&item, "@", MilliText(d->milli()));
      items.push_back(std::move(item));
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < sorted.size() && whole(sorted[j]) && sorted[j]->kind() == d->kind() &&
           sorted[j]->index() == sorted[j - 1]->index() + 1) {
      ++j;
    }
    if (j - i > 1) absl::StrAppend(&item, "-", sorted[j - 1]->index());
    items.push_back(std::move(item));
    i = j;
  }
  return items.empty() ? "-" : absl::StrJoin(items, ",");
}

std::string AgeText(absl::Duration age) {
  int64_t s = absl::ToInt64Seconds(age);
  if (s < 0) s = 0;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m", s % 60, "s");
  if (s < 86400) return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
  return absl::StrCat(s / 86400, "d", (s % 86400) / 3600, "h");
}

std::vector<ModelTally> TallyNodes(const google::protobuf::RepeatedPtrField<v1::Node>& nodes) {
  std::vector<ModelTally> rows;
  for (const v1::Node& node : nodes) {
    std::map<std::pair<int, std::string>, ModelTally> by_model;
    for (const v1::Device& d : node.devices()) {
      ModelTally& t = by_model[{static_cast<int>(d.kind()), d.model()}];
      t.kind = d.kind();
      t.model = d.model();
      const DeviceCount c = CountDevice(d);
      t.total += kWhole;
      t.slurm += c.slurm;
      t.pods += c.pods;
      t.free += kWhole - c.slurm - c.pods;
    }
    if (by_model.empty()) by_model[{0, ""}] = ModelTally();
    for (auto& [key, t] : by_model) {
      t.node = node.name();
      t.state = node.state();
      t.slurm_state = node.slurm_state();
      rows.push_back(std::move(t));
    }
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const ModelTally& a, const ModelTally& b) { return a.node < b.node; });
  return rows;
}

std::string RenderNodesTable(const v1::ListNodesResponse& response) {
  if (response.nodes().empty()) return "No nodes.\n";
  // Slurm's own node state beside Kubernetes' when the bridge reports it
  // (an admin's drain shows here while STATE stays Ready).
  const bool with_slurm = std::any_of(response.nodes().begin(), response.nodes().end(),
                                      [](const v1::Node& n) { return !n.slurm_state().empty(); });
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "STATE", "KIND", "MODEL", "TOTAL", "SLURM", "PODS", "FREE"}};
  if (with_slurm) rows[0].insert(rows[0].begin() + 2, "SLURM-STATE");
  std::map<int, ModelTally> by_kind;
  for (const ModelTally& t : TallyNodes(response.nodes())) {
    rows.push_back({t.node, StateText(t.state), KindText(t.kind), OrDash(t.model),
                    MilliDevices(t.total), MilliDevices(t.slurm), MilliDevices(t.pods),
                    MilliDevices(t.free)});
    if (with_slurm) rows.back().insert(rows.back().begin() + 2, OrDash(t.slurm_state));
    if (t.kind != v1::DEVICE_KIND_UNSPECIFIED) AddToKind(t, &by_kind);
  }
  const int n = response.nodes_size();
  std::string summary = absl::StrCat(n, n == 1 ? " node" : " nodes");
  for (const auto& [kind, k] : by_kind) {
    absl::StrAppend(&summary, "; ", KindText(k.kind), ": ", MilliDevices(k.total), " total, ",
                    MilliDevices(k.slurm), " slurm, ", MilliDevices(k.pods), " pods, ",
                    MilliDevices(k.free), " free");
  }
  return FormatTable(rows) + summary + "\n";
}

std::string RenderHoldsTable(const v1::ListHoldingsResponse& response, absl::Time now) {
  if (response.holdings().empty()) return "No holdings.\n";
  const auto pod_names = PodNames(response);
  std::vector<std::vector<std::string>> rows = {{"NODE", "OWNER", "DEVICES", "SINCE"}};
  for (const v1::Holding* h : SortedPointers(response.holdings(), NodeLess)) {
    std::string since = "-";
    if (h->has_granted_at()) {
      const absl::Time t =
          absl::FromUnixSeconds(h->granted_at().seconds()) + absl::Nanoseconds(h->granted_at().nanos());
      since = AgeText(now - t);
    }
    rows.push_back({h->node(), OwnerText(h->owner(), PodNameFor(h->owner(), pod_names)),
                    DevicesText(h->devices()), since});
  }
  return FormatTable(rows);
}

std::string RenderNodeDetail(const v1::Node& node) {
  std::vector<std::vector<std::string>> head = {
      {"Name:", node.name()},
      {"State:", StateText(node.state())},
      {"Pool:", OrDash(node.pool())},
      {"Zone:", OrDash(node.zone())},
      {"CPUs:", absl::StrCat(node.cpus())},
      {"Memory:", absl::StrCat(node.memory_mib(), " MiB")},
      {"Generation:", absl::StrCat(node.generation())},
  };
  if (!node.slurm_state().empty()) {
    head.insert(head.begin() + 2,
                {"Slurm:", node.slurm_reason().empty()
                               ? node.slurm_state()
                               : absl::StrCat(node.slurm_state(), " (", node.slurm_reason(), ")")});
  }
  std::string out = FormatTable(head);
  if (node.devices().empty()) return out + "\nNo devices.\n";

  const auto pod_names = PodNames(node);
  std::vector<std::vector<std::string>> rows = {
      {"KIND", "INDEX", "ID", "MODEL", "USED", "HOLDERS"}};
  for (const v1::Device* d : SortedPointers(node.devices(), KindIndexLess<v1::Device>)) {
    std::vector<std::string> holders;
    for (const v1::DeviceHolder& h : d->holders()) {
      std::string text = OwnerText(h.owner(), PodNameFor(h.owner(), pod_names));
      if (h.milli() != 0 && h.milli() < Capacity(*d)) {
        absl::StrAppend(&text, " (", MilliText(h.milli()), ")");
      }
      holders.push_back(std::move(text));
    }
    rows.push_back({KindText(d->kind()), absl::StrCat(d->index()), OrDash(d->id()),
                    OrDash(d->model()), MilliText(d->used_milli()),
                    holders.empty() ? "-" : absl::StrJoin(holders, ", ")});
  }
  return out + "\n" + FormatTable(rows);
}

Json NodesJson(const v1::ListNodesResponse& response) {
  std::vector<ModelTally> tallies = TallyNodes(response.nodes());

  auto count_fields = [](Json& j, const ModelTally& t) {
    j["total"] = CountJson(t.total);
    j["slurm"] = CountJson(t.slurm);
    j["pods"] = CountJson(t.pods);
    j["free"] = CountJson(t.free);
  };
  Json out = Json::object();
  out["nodes"] = Json::array();
  std::map<int, ModelTally> by_kind;
  for (const v1::Node* n : SortedPointers(response.nodes(), NameLess)) {
    Json jn = NodeHeadJson(*n);
    jn["generation"] = n->generation();
    jn["models"] = Json::array();
    for (const ModelTally& t : tallies) {
      if (t.node != n->name() || t.kind == v1::DEVICE_KIND_UNSPECIFIED) continue;
      Json jm = Json::object();
      jm["kind"] = KindText(t.kind);
      jm["model"] = t.model;
      count_fields(jm, t);
      jn["models"].push_back(std::move(jm));
      AddToKind(t, &by_kind);
    }
    out["nodes"].push_back(std::move(jn));
  }
  Json summary = Json::object();
  summary["nodes"] = response.nodes_size();
  summary["kinds"] = Json::array();
  for (const auto& [kind, k] : by_kind) {
    Json jk = Json::object();
    jk["kind"] = KindText(k.kind);
    count_fields(jk, k);
    summary["kinds"].push_back(std::move(jk));
  }
  out["summary"] = std::move(summary);
  return out;
}

std::string RenderWorkloadTable(const v1::WorkloadResponse& response) {
  std::string out = absl::StrFormat(
      "%d shapes exported of %d tracked, covering %.1f%% of %.1f arrivals (half-life %s; %d "
      "counted, %d seen again, %d shapes dropped).\n",
      response.shapes_size(), response.tracked(), 100 * response.coverage(),
      response.total_weight(), Printable(response.half_life()), response.arrivals(),
      response.duplicates(),
      response.evictions());
  if (response.shapes().empty()) return out + "No shapes learned yet.\n";
  std::vector<std::vector<std::string>> rows = {
      {"SHARE", "KIND", "DEVICES", "PER-DEVICE", "MODELS", "CPU", "MEMORY"}};
  for (const v1::WorkloadShape& s : response.shapes()) {
    rows.push_back({absl::StrFormat("%.1f%%", 100 * s.share()), KindText(s.kind()),
                    absl::StrCat(s.count()),
                    s.count() == 0 ? "-"
                    : s.milli() == 0 || s.milli() >= kWhole
                        ? "whole"
                        : absl::StrCat(s.milli(), "m"),
                    s.models().empty() ? "any" : absl::StrJoin(s.models(), ","),
                    absl::StrCat(s.cpu_milli(), "m"),
                    s.memory_mib() == 0 ? "-" : absl::StrCat(s.memory_mib(), "Mi")});
  }
  return out + FormatTable(rows);
}

Json WorkloadJson(const v1::WorkloadResponse& response) {
  Json out = Json::object();
  out["shapes"] = Json::array();
  for (const v1::WorkloadShape& s : response.shapes()) {
    Json j = Json::object();
    j["kind"] = KindText(s.kind());
    j["count"] = s.count();
    j["milli"] = s.milli();
    j["models"] = Json::array();
    for (const std::string& m : s.models()) j["models"].push_back(m);
    j["cpu_milli"] = s.cpu_milli();
    j["memory_mib"] = s.memory_mib();
    j["weight"] = s.weight();
    j["share"] = s.share();
    out["shapes"].push_back(std::move(j));
  }
  out["tracked"] = response.tracked();
  out["coverage"] = response.coverage();
  out["total_weight"] = response.total_weight();
  out["arrivals"] = response.arrivals();
  out["duplicates"] = response.duplicates();
  out["evictions"] = response.evictions();
  out["half_life"] = response.half_life();
  return out;
}

Json HoldsJson(const v1::ListHoldingsResponse& response) {
  const auto pod_names = PodNames(response);
  Json out = Json::object();
  out["holdings"] = Json::array();
  for (const v1::Holding* h : SortedPointers(response.holdings(), NodeLess)) {
    Json j = Json::object();
    j["node"] = h->node();
    j["owner"] = OwnerJson(h->owner());
    j["owner_text"] = OwnerText(h->owner(), PodNameFor(h->owner(), pod_names));
    j["holder"] = ClassText(ClassOf(h->owner()));
    j["devices"] = Json::array();
    for (const v1::HeldDevice& d : h->devices()) {
      Json jd = Json::object();
      jd["kind"] = KindText(d.kind());
      jd["index"] = d.index();
      jd["id"] = d.id();
      jd["milli"] = d.milli() == 0 ? static_cast<uint32_t>(kWhole) : d.milli();
      j["devices"].push_back(std::move(jd));
    }
    j["granted_at"] = h->has_granted_at()
                          ? Json(google::protobuf::util::TimeUtil::ToString(h->granted_at()))
                          : Json(nullptr);
    j["generation"] = h->generation();
    out["holdings"].push_back(std::move(j));
  }
  return out;
}

Json NodeJson(const v1::Node& node) {
  const auto pod_names = PodNames(node);
  Json j = NodeHeadJson(node);
  j["cpus"] = node.cpus();
  j["memory_mib"] = node.memory_mib();
  j["generation"] = node.generation();
  // Sorted keys: the proto map has no stable order.
  std::map<std::string, std::string> labels(node.labels().begin(), node.labels().end());
  j["labels"] = Json::object();
  for (const auto& [k, v] : labels) j["labels"][k] = v;
  j["devices"] = Json::array();
  for (const v1::Device& d : node.devices()) {
    Json jd = Json::object();
    jd["kind"] = KindText(d.kind());
    jd["index"] = d.index();
    jd["id"] = d.id();
    jd["model"] = d.model();
    jd["capacity_milli"] = Capacity(d);
    jd["used_milli"] = d.used_milli();
    Json topo = Json::object();
    const v1::Topology& t = d.topology();
    if (!t.nvlink_domain().empty()) topo["nvlink_domain"] = t.nvlink_domain();
    if (!t.tpu_host_bounds().empty()) topo["tpu_host_bounds"] = t.tpu_host_bounds();
    if (!t.tpu_topology().empty()) topo["tpu_topology"] = t.tpu_topology();
    if (!t.tpu_subslice_shapes().empty()) {
      topo["tpu_subslice_shapes"] =
          std::vector<std::string>(t.tpu_subslice_shapes().begin(), t.tpu_subslice_shapes().end());
    }
    if (!t.block().empty()) topo["block"] = t.block();
    if (!t.subblock().empty()) topo["subblock"] = t.subblock();
    jd["topology"] = std::move(topo);
    jd["holders"] = Json::array();
    for (const v1::DeviceHolder& h : d.holders()) {
      Json jh = Json::object();
      jh["owner"] = OwnerJson(h.owner());
      jh["owner_text"] = OwnerText(h.owner(), PodNameFor(h.owner(), pod_names));
      jh["holder"] = ClassText(ClassOf(h.owner()));
      jh["milli"] = h.milli() == 0 ? Capacity(d) : static_cast<int64_t>(h.milli());
      jd["holders"].push_back(std::move(jh));
    }
    j["devices"].push_back(std::move(jd));
  }
  return j;
}

}  // namespace duet::ctl
