#include "bridge/api/validate.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "bridge/ledger/ledger.h"

namespace duet {
namespace {

constexpr char kHex[] = "0123456789abcdef";

// Printable ASCII without blanks: no control character (a newline or an
// ANSI escape forges log lines and colours terminals), no space.
bool Graphic(absl::string_view s) {
  for (char c : s) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

// [a-z0-9]([-a-z0-9]*[a-z0-9])?, of any length.
bool Rfc1123Label(absl::string_view s) {
  if (s.empty() || s.front() == '-' || s.back() == '-') return false;
  for (char c : s) {
    if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
          absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      return false;
    }
  }
  return true;
}

// Labels joined by '.', as Kubernetes' IsDNS1123Subdomain (which bounds the
// whole, not each label).
bool Rfc1123Subdomain(absl::string_view s) {
  if (s.empty()) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    if (!Rfc1123Label(s.substr(start, dot == absl::string_view::npos ? dot : dot - start))) {
      return false;
    }
    if (dot == absl::string_view::npos) return true;
    start = dot + 1;
  }
}

absl::Status Refuse(absl::string_view field, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", Echo(value), " ", why));
}

absl::Status CheckLength(absl::string_view field, absl::string_view value, size_t max) {
  if (value.size() > max) {
    return Refuse(field, value, absl::StrCat("is longer than ", max, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckUid(absl::string_view field, absl::string_view uid) {
  if (uid.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must be set"));
  if (absl::Status s = CheckLength(field, uid, kMaxUidLength); !s.ok()) return s;
  if (!Graphic(uid)) return Refuse(field, uid, "has a character outside printable ASCII");
  return absl::OkStatus();
}

}  // namespace

std::string Echo(absl::string_view value) {
  std::string out = "\"";
  size_t used = 0;  // bytes of `value` quoted
  for (; used < value.size() && out.size() - 1 < kMaxEchoBytes; ++used) {
    const unsigned char c = static_cast<unsigned char>(value[used]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 0xf]};
    }
  }
  out.push_back('"');
  if (used < value.size()) absl::StrAppend(&out, "\xE2\x80\xA6(", value.size(), " bytes)");
  return out;
}

absl::Status CheckNodeName(absl::string_view field, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must be set"));
  if (absl::Status s = CheckLength(field, name, kMaxNameLength); !s.ok()) return s;
  if (!Graphic(name)) return Refuse(field, name, "has a character outside printable ASCII");
  return absl::OkStatus();
}

absl::Status CheckKubeNodeName(absl::string_view field, absl::string_view name) {
  if (absl::Status s = CheckNodeName(field, name); !s.ok()) return s;
  if (!Rfc1123Subdomain(name)) {
    return Refuse(field, name, "is not a Kubernetes node name (RFC 1123 subdomain)");
  }
  return absl::OkStatus();
}

absl::Status CheckNodeNames(absl::string_view field,
                            const google::protobuf::RepeatedPtrField<std::string>& names) {
  // The count first: the set below is then bounded too.
  if (static_cast<size_t>(names.size()) > kMaxNamesPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", names.size(),
                                                   " names; at most ", kMaxNamesPerRequest,
                                                   " per request (none: every node)"));
  }
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(names.size());
  for (const std::string& name : names) {
    if (absl::Status s = CheckNodeName(field, name); !s.ok()) return s;
    if (!seen.insert(name).second) return Refuse(field, name, "is listed twice");
  }
  return absl::OkStatus();
}

absl::Status CheckOwnerStrings(const Owner& owner) {
  switch (owner.kind) {
    case OwnerKind::kSlurmJob:
    case OwnerKind::kSlurmStep:
      return absl::OkStatus();  // numbers only; ValidateOwner checks them
    case OwnerKind::kPlaceholder:
      return CheckUid("owner.placeholder.pod_uid", owner.pod_uid);
    case OwnerKind::kClaim:
    case OwnerKind::kLend:
      // The lending mode's owners are duet-bridge's own (docs/dra.md): its
      // admission webhook and lend jobs make and end them, never a caller.
      return absl::InvalidArgumentError(absl::StrCat(
          "owner: ", owner.kind == OwnerKind::kClaim ? "claim" : "lend",
          " owners are duet-bridge's own (the DRA lending mode); no caller may hold or release "
          "them"));
    case OwnerKind::kGangSlot:
      // A gang's slots are made and ended by duet-bridge's gang registry
      // (docs/gangs.md), never by a caller.
      return absl::InvalidArgumentError(
          "owner: gang_slot owners are duet-bridge's own (gangs); no caller may hold or release "
          "them");
    case OwnerKind::kPod:
      break;
  }
  if (absl::Status s = CheckUid("pod.uid", owner.pod_uid); !s.ok()) return s;
  // Namespace and name are optional (a pod is its uid); when set they are
  // what Kubernetes allows, since they reach messages, events and API paths.
  const absl::string_view ns = owner.pod_namespace;
  if (!ns.empty()) {
    if (absl::Status s = CheckLength("pod.namespace", ns, kMaxNamespaceLength); !s.ok()) return s;
    if (!Rfc1123Label(ns)) {
      return Refuse("pod.namespace", ns, "is not a Kubernetes namespace (RFC 1123 label)");
    }
  }
  const absl::string_view name = owner.pod_name;
  if (!name.empty()) {
    if (absl::Status s = CheckLength("pod.name", name, kMaxNameLength); !s.ok()) return s;
    if (!Rfc1123Subdomain(name)) {
      return Refuse("pod.name", name, "is not a Kubernetes pod name (RFC 1123 subdomain)");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHoldSelection(const v1::HoldRequest& request) {
  if (request.has_devices() &&
      static_cast<size_t>(request.devices().devices_size()) > kMaxDevicesPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("devices: ", request.devices().devices_size(),
                                                   " listed; a node has at most ",
                                                   kMaxDevicesPerNode));
  }
  if (request.has_count()) {
    // Models are free text (an inventory may say "NVIDIA H100 80GB"): blanks
    // are allowed, control characters are not.
    const std::string& model = request.count().model();
    if (absl::Status s = CheckLength("count.model", model, kMaxNameLength); !s.ok()) return s;
    for (char c : model) {
      if (c < 0x20 || c >= 0x7f) {
        return Refuse("count.model", model, "has a character outside printable ASCII");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPlacePodAmounts(const v1::PlacePodRequest& request) {
  // Before any arithmetic: placement works in int64, where 2^64-1 MiB of
  // memory became -1 and fit every node.
  for (auto [field, n] : {std::pair<const char*, uint32_t>{"gpus", request.gpus()},
                          std::pair<const char*, uint32_t>{"tpus", request.tpus()}}) {
    if (n > kMaxDevicesPerNode) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", n, "; a node has at most ", kMaxDevicesPerNode, " devices"));
    }
  }
  if (request.cpus() > kMaxPodCpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpus: ", request.cpus(), " is more than ", kMaxPodCpus));
  }
  if (request.memory_mib() > kMaxPodMemoryMib) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_mib: ", request.memory_mib(), " is more than ", kMaxPodMemoryMib));
  }
  return absl::OkStatus();
}

}  // namespace duet
