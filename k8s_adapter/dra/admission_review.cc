#include "k8s_adapter/dra/admission_review.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace duet {
namespace k8s_dra {

namespace {

using json = nlohmann::json;
constexpr int kMaxDepth = 64;

// The member `key` of object `j`; null when absent (or `j` is not an object).
const json* Member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// A string member: "" when absent; INVALID_ARGUMENT when not a string.
absl::StatusOr<std::string> String(const json& j, const char* key, const std::string& where) {
  const json* m = Member(j, key);
  if (m == nullptr) return std::string();
  if (!m->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": must be a string"));
  }
  return m->get<std::string>();
}

absl::StatusOr<std::string> Required(const json& j, const char* key, const std::string& where) {
  absl::StatusOr<std::string> s = String(j, key, where);
  if (s.ok() && s->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": required"));
  }
  return s;
}

// The pods a claim is for, into `out` (each uid once): status.reservedFor
// entries of resource "pods" (core group) and metadata.ownerReferences of
// kind Pod (apiVersion v1). Entries of other resources and kinds are not
// pods; an entry that is not an object, or a uid that is not a string, is
// INVALID_ARGUMENT.
absl::Status ParseConsumers(const json& claim, const std::string& where,
                            std::vector<std::string>* out) {
  auto add = [out](const std::string& uid) {
    if (!uid.empty() && std::find(out->begin(), out->end(), uid) == out->end()) out->push_back(uid);
  };
  const json* status = Member(claim, "status");
  const json* reserved = status != nullptr && status->is_object() ? Member(*status, "reservedFor")
                                                                  : nullptr;
  if (reserved != nullptr) {
    const std::string at = absl::StrCat(where, ".status.reservedFor");
    if (!reserved->is_array()) return absl::InvalidArgumentError(at + ": must be a list");
    for (const json& r : *reserved) {
      if (!r.is_object()) return absl::InvalidArgumentError(at + "[]: must be an object");
      absl::StatusOr<std::string> resource = String(r, "resource", at + "[]");
      absl::StatusOr<std::string> group = String(r, "apiGroup", at + "[]");
      absl::StatusOr<std::string> uid = String(r, "uid", at + "[]");
      for (const auto* v : {&resource, &group, &uid}) {
        if (!v->ok()) return v->status();
      }
      if (*resource == "pods" && group->empty()) add(*uid);
    }
  }
  const json* md = Member(claim, "metadata");
  const json* owners = md != nullptr && md->is_object() ? Member(*md, "ownerReferences") : nullptr;
  if (owners != nullptr) {
    const std::string at = absl::StrCat(where, ".metadata.ownerReferences");
    if (!owners->is_array()) return absl::InvalidArgumentError(at + ": must be a list");
    for (const json& o : *owners) {
      if (!o.is_object()) return absl::InvalidArgumentError(at + "[]: must be an object");
      absl::StatusOr<std::string> kind = String(o, "kind", at + "[]");
      absl::StatusOr<std::string> version = String(o, "apiVersion", at + "[]");
      absl::StatusOr<std::string> uid = String(o, "uid", at + "[]");
      for (const auto* v : {&kind, &version, &uid}) {
        if (!v->ok()) return v->status();
      }
      if (*kind == "Pod" && *version == "v1") add(*uid);
    }
  }
  return absl::OkStatus();
}

// A claim's status.allocation (null when none), its results into `out` and
// its node into `node`.
absl::Status ParseAllocation(const json& claim, const std::string& where,
                             std::vector<dra::AllocationResult>* out, std::string* node) {
  if (!claim.is_object() || Member(claim, "kind") == nullptr ||
      claim["kind"] != "ResourceClaim") {
    return absl::InvalidArgumentError(absl::StrCat(where, ": must be a ResourceClaim"));
  }
  const json* status = Member(claim, "status");
  if (status != nullptr && !status->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".status: must be an object"));
  }
  const json* alloc = status != nullptr ? Member(*status, "allocation") : nullptr;
  if (alloc == nullptr) return absl::OkStatus();
  const std::string aw = absl::StrCat(where, ".status.allocation");
  if (!alloc->is_object()) return absl::InvalidArgumentError(absl::StrCat(aw, ": must be an object"));
  const json* devices = Member(*alloc, "devices");
  const json* results = devices != nullptr ? Member(*devices, "results") : nullptr;
  if (devices != nullptr && !devices->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(aw, ".devices: must be an object"));
  }
  if (results != nullptr) {
    if (!results->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(aw, ".devices.results: must be a list"));
    }
    for (size_t i = 0; i < results->size(); ++i) {
      const json& r = (*results)[i];
      const std::string rw = absl::StrCat(aw, ".devices.results[", i, "]");
      if (!r.is_object()) return absl::InvalidArgumentError(absl::StrCat(rw, ": must be an object"));
      dra::AllocationResult res;
      for (auto [field, dst] : {std::pair{"driver", &res.device.driver},
                                std::pair{"pool", &res.device.pool},
                                std::pair{"device", &res.device.device}}) {
        absl::StatusOr<std::string> v = Required(r, field, rw);
        if (!v.ok()) return v.status();
        *dst = std::move(*v);
      }
      absl::StatusOr<std::string> request = String(r, "request", rw);
      if (!request.ok()) return request.status();
      res.request = std::move(*request);
      if (const json* admin = Member(r, "adminAccess"); admin != nullptr) {
        if (!admin->is_boolean()) {
          return absl::InvalidArgumentError(absl::StrCat(rw, ".adminAccess: must be a boolean"));
        }
        res.admin_access = admin->get<bool>();
      }
      out->push_back(std::move(res));
    }
  }
  if (node == nullptr) return absl::OkStatus();
  // kube-scheduler writes one term: matchFields metadata.name In [node].
  std::set<std::string> nodes;
  const json* selector = Member(*alloc, "nodeSelector");
  const json* terms = selector != nullptr ? Member(*selector, "nodeSelectorTerms") : nullptr;
  if (terms != nullptr && terms->is_array()) {
    for (const json& t : *terms) {
      const json* fields = Member(t, "matchFields");
      if (fields == nullptr || !fields->is_array()) continue;
      for (const json& f : *fields) {
        if (!f.is_object() || f.value("key", json()) != "metadata.name" ||
            f.value("operator", json()) != "In") {
          continue;
        }
        const json* values = Member(f, "values");
        if (values == nullptr || !values->is_array()) continue;
        for (const json& v : *values) {
          if (v.is_string()) nodes.insert(v.get<std::string>());
        }
      }
    }
  }
  if (nodes.size() == 1) *node = *nodes.begin();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedReview> ParseAdmissionReview(const json& review) {
  if (!review.is_object()) {
    return absl::InvalidArgumentError("AdmissionReview: the body must be a JSON object");
  }
  ParsedReview out;
  if (review.value("apiVersion", json()) != "admission.k8s.io/v1" ||
      review.value("kind", json()) != "AdmissionReview") {
    return absl::InvalidArgumentError(
        "AdmissionReview: apiVersion must be admission.k8s.io/v1 and kind AdmissionReview "
        "(the webhook's admissionReviewVersions: [v1])");
  }
  out.api_version = "admission.k8s.io/v1";
  const json* req = Member(review, "request");
  if (req == nullptr || !req->is_object()) {
    return absl::InvalidArgumentError("AdmissionReview.request: required");
  }
  absl::StatusOr<std::string> uid = Required(*req, "uid", "request");
  if (!uid.ok()) return uid.status();
  out.uid = std::move(*uid);
  const json* resource = Member(*req, "resource");
  const std::string version = resource != nullptr ? resource->value("version", "") : "";
  if (resource == nullptr || !resource->is_object() ||
      resource->value("group", "") != "resource.k8s.io" ||
      resource->value("resource", "") != "resourceclaims" ||
      (version != "v1" && version != "v1beta2" && version != "v1beta1")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request.resource: must be resource.k8s.io/v1 (or v1beta2, v1beta1) resourceclaims, got ",
        resource != nullptr ? resource->dump() : "none"));
  }
  absl::StatusOr<std::string> sub = String(*req, "subResource", "request");
  if (!sub.ok()) return sub.status();
  if (*sub != "status") {
    return absl::InvalidArgumentError(absl::StrCat(
        "request.subResource: must be status (the webhook judges resourceclaims/status), got \"",
        *sub, "\""));
  }
  absl::StatusOr<std::string> op = String(*req, "operation", "request");
  if (!op.ok()) return op.status();
  if (*op != "UPDATE") {
    return absl::InvalidArgumentError(
        absl::StrCat("request.operation: must be UPDATE, got \"", *op, "\""));
  }
  const json* object = Member(*req, "object");
  if (object == nullptr) return absl::InvalidArgumentError("request.object: required");
  if (absl::Status s = ParseAllocation(*object, "request.object", &out.ask.new_results, &out.ask.node);
      !s.ok()) {
    return s;
  }
  const json* md = Member(*object, "metadata");
  if (md == nullptr || !md->is_object()) {
    return absl::InvalidArgumentError("request.object.metadata: required");
  }
  if (absl::Status s = ParseConsumers(*object, "request.object", &out.ask.pods); !s.ok()) return s;
  for (auto [field, dst] : {std::pair{"uid", &out.ask.claim.uid},
                            std::pair{"namespace", &out.ask.claim.ns},
                            std::pair{"name", &out.ask.claim.name}}) {
    absl::StatusOr<std::string> v = Required(*md, field, "request.object.metadata");
    if (!v.ok()) return v.status();
    *dst = std::move(*v);
  }
  if (const json* old = Member(*req, "oldObject"); old != nullptr) {
    if (absl::Status s = ParseAllocation(*old, "request.oldObject", &out.ask.old_results, nullptr);
        !s.ok()) {
      return s;
    }
  }
  if (const json* dry = Member(*req, "dryRun"); dry != nullptr) {
    if (!dry->is_boolean()) return absl::InvalidArgumentError("request.dryRun: must be a boolean");
    out.ask.dry_run = dry->get<bool>();
  }
  return out;
}

absl::StatusOr<ParsedReview> ParseAdmissionReviewBody(absl::string_view body) {
  // Values nested too deep are dropped while parsing (never built), and the
  // body refused.
  bool too_deep = false;
  json j = json::parse(
      body.begin(), body.end(),
      [&too_deep](int depth, json::parse_event_t event, json&) {
        if (depth >= kMaxDepth && (event == json::parse_event_t::object_start ||
                                   event == json::parse_event_t::array_start)) {
          too_deep = true;
          return false;
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (too_deep) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdmissionReview: nests JSON deeper than ", kMaxDepth, " levels"));
  }
  if (j.is_discarded()) return absl::InvalidArgumentError("AdmissionReview: the body is not JSON");
  return ParseAdmissionReview(j);
}

json AdmissionResponse(const std::string& api_version, const std::string& uid,
                       const dra::AdmissionVerdict& verdict) {
  json response = {{"uid", uid}, {"allowed", verdict.allowed}};
  if (!verdict.allowed) {
    response["status"] = {{"code", 403}, {"reason", verdict.reason}, {"message", verdict.message}};
  }
  return json{{"apiVersion", api_version}, {"kind", "AdmissionReview"}, {"response", response}};
}

}  // namespace k8s_dra
}  // namespace duet
