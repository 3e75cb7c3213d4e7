#include "k8s_adapter/token_review.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {
namespace {

std::string FirstExtra(const nlohmann::json& extra, const char* key) {
  auto it = extra.find(key);
  if (it == extra.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) return "";
  return (*it)[0].get<std::string>();
}

}  // namespace

absl::StatusOr<ReviewedToken> ReviewToken(KubeClient* client, const std::string& token,
                                          const std::vector<std::string>& audiences) {
  nlohmann::json review = {{"apiVersion", "authentication.k8s.io/v1"},
                           {"kind", "TokenReview"},
                           {"spec", {{"token", token}, {"audiences", audiences}}}};
  absl::StatusOr<std::string> reply =
      client->Post("/apis/authentication.k8s.io/v1/tokenreviews", review.dump());
  if (!reply.ok()) {
    return absl::Status(reply.status().code(),
                        absl::StrCat("TokenReview: ", reply.status().message()));
  }
  // nlohmann throws on malformed JSON; this is the one place that parses it.
  nlohmann::json j = nlohmann::json::parse(*reply, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("status") || !j["status"].is_object()) {
    return absl::InvalidArgumentError("TokenReview: the API server's reply has no status");
  }
  const nlohmann::json& st = j["status"];
  ReviewedToken out;
  out.authenticated = st.value("authenticated", false);
  if (st.contains("error") && st["error"].is_string()) out.error = st["error"].get<std::string>();
  if (st.contains("audiences") && st["audiences"].is_array()) {
    for (const auto& a : st["audiences"]) {
      if (a.is_string()) out.audiences.push_back(a.get<std::string>());
    }
  }
  if (st.contains("user") && st["user"].is_object()) {
    const nlohmann::json& u = st["user"];
    if (u.contains("username") && u["username"].is_string()) {
      out.username = u["username"].get<std::string>();
    }
    if (u.contains("groups") && u["groups"].is_array()) {
      for (const auto& g : u["groups"]) {
        if (g.is_string()) out.groups.push_back(g.get<std::string>());
      }
    }
    if (u.contains("extra") && u["extra"].is_object()) {
      out.node_name = FirstExtra(u["extra"], kExtraNodeName);
      out.pod_name = FirstExtra(u["extra"], kExtraPodName);
      out.pod_uid = FirstExtra(u["extra"], kExtraPodUid);
    }
  }
  if (out.authenticated && !audiences.empty()) {
    // An authenticator that ignores audiences answers without status.audiences;
    // the API server's own authenticators return the intersection.
    const bool any = std::any_of(out.audiences.begin(), out.audiences.end(), [&](const auto& a) {
      return std::find(audiences.begin(), audiences.end(), a) != audiences.end();
    });
    if (!any) {
      out.authenticated = false;
      out.error = "the token is not for this audience";
    }
  }
  if (out.authenticated && out.username.empty()) {
    out.authenticated = false;
    out.error = "the API server named no user";
  }
  return out;
}

}  // namespace k8s
}  // namespace duet
