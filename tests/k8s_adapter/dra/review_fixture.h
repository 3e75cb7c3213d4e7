#pragma once

// An AdmissionReview of a resourceclaims/status write, shaped as
// kube-apiserver (and tests/fakes/fake_apiserver.py's _admit) sends it.

#include <string>

#include "nlohmann/json.hpp"

namespace duet {
namespace k8s_dra {
namespace testing {

inline nlohmann::json Allocation(const std::string& node, const std::string& device,
                                 bool admin = false) {
  nlohmann::json result = {{"request", "gpu"}, {"driver", "gpu.nvidia.com"}, {"pool", node},
                           {"device", device}};
  if (admin) result["adminAccess"] = true;
  return {{"devices", {{"results", {result}}}},
          {"nodeSelector",
           {{"nodeSelectorTerms",
             {{{"matchFields",
                {{{"key", "metadata.name"}, {"operator", "In"}, {"values", {node}}}}}}}}}}};
}

inline nlohmann::json Claim(const std::string& version, nlohmann::json allocation) {
  nlohmann::json c = {
      {"apiVersion", "resource.k8s.io/" + version},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", "train-gpu"}, {"namespace", "ml"}, {"uid", "claim-uid-1"}}},
      {"spec",
       {{"devices",
         {{"requests", {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.nvidia.com"}}}}}}}}}}};
  if (!allocation.is_null()) c["status"] = {{"allocation", allocation}};
  return c;
}

inline nlohmann::json Review(const std::string& version = "v1",
                             nlohmann::json allocation = Allocation("gpu-node-1", "gpu-3"),
                             bool dry_run = false) {
  nlohmann::json gvr = {{"group", "resource.k8s.io"}, {"version", version}, {"resource", "resourceclaims"}};
  nlohmann::json gvk = {{"group", "resource.k8s.io"}, {"version", version}, {"kind", "ResourceClaim"}};
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "review-uid-7"},
            {"kind", gvk},
            {"resource", gvr},
            {"requestKind", gvk},
            {"requestResource", gvr},
            {"subResource", "status"},
            {"requestSubResource", "status"},
            {"name", "train-gpu"},
            {"namespace", "ml"},
            {"operation", "UPDATE"},
            {"userInfo", {{"username", "system:kube-scheduler"}}},
            {"object", Claim(version, std::move(allocation))},
            {"oldObject", Claim(version, nullptr)},
            {"dryRun", dry_run}}}};
}

}  // namespace testing
}  // namespace k8s_dra
}  // namespace duet
