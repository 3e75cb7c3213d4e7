#include "bridge/auth/authz.h"

#include <openssl/sha.h>

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/reason.h"
#include "grpcpp/server_context.h"
#include "k8s_adapter/token_review.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace duet {
namespace auth {
namespace {

constexpr char kBearer[] = "Bearer ";

std::string Sha256(const std::string& s) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d);
  return std::string(reinterpret_cast<const char*>(d), sizeof(d));
}

// A namespace or pod name that can go into a URL path as is (DNS labels and
// subdomains); anything else names no pod.
bool PathSafe(const std::string& s) {
  return !s.empty() && s.size() <= 253 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
  }) && s != "." && s != "..";
}

// GET the pod; its uid must be `uid`.
absl::StatusOr<PodBinding> GetPod(k8s::KubeClient* kube, const std::string& ns,
                                  const std::string& name, const std::string& uid) {
  PodBinding out;
  if (kube == nullptr || !PathSafe(ns) || !PathSafe(name)) return out;
  absl::StatusOr<std::string> body =
      kube->Get(absl::StrCat("/api/v1/namespaces/", ns, "/pods/", name));
  if (absl::IsNotFound(body.status())) return out;
  if (!body.ok()) return body.status();
  nlohmann::json pod = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!pod.is_object()) return absl::UnavailableError("the API server's pod is not JSON");
  const nlohmann::json& meta = pod.value("metadata", nlohmann::json::object());
  if (!meta.is_object() || meta.value("uid", "") != uid) return out;  // another pod now
  out.found = true;
  const nlohmann::json& spec = pod.value("spec", nlohmann::json::object());
  if (spec.is_object()) out.node = spec.value("nodeName", "");
  return out;
}

}  // namespace

CallerInfo CallerFromContext(const grpc::ServerContextBase& ctx) {
  CallerInfo out;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    const std::string v(it->second.data(), it->second.size());
    if (absl::StartsWith(v, kBearer)) out.bearer = v.substr(sizeof(kBearer) - 1);
  }
  out.local = absl::StartsWith(ctx.peer(), "unix:");
  std::shared_ptr<const grpc::AuthContext> ac = ctx.auth_context();
  if (ac != nullptr) {
    for (const grpc::string_ref& v : ac->FindPropertyValues("transport_security_type")) {
      if (std::string(v.data(), v.size()) == "ssl") out.tls = true;
    }
  }
  return out;
}

PodBindingFn PodBindingFrom(std::function<std::optional<PodBinding>(const std::string& uid)> view,
                            k8s::KubeClient* kube) {
  return [view, kube](const Owner& owner) -> absl::StatusOr<PodBinding> {
    if (view) {
      if (std::optional<PodBinding> seen = view(owner.pod_uid)) return *seen;
    }
    return GetPod(kube, owner.pod_namespace, owner.pod_name, owner.pod_uid);
  };
}

CallAuthorizer::CallAuthorizer(k8s::KubeClient* kube, PodBindingFn pod_binding, Options options)
    : kube_(kube), pod_binding_(std::move(pod_binding)), options_(std::move(options)) {}

absl::Status CallAuthorizer::Refuse(const std::string& method, absl::Status status,
                                    const std::string& why, const std::string& node) const {
  if (options_.on_refusal) options_.on_refusal(method, why);
  std::map<std::string, std::string> md = {{"why", why}};
  if (!node.empty()) md["node"] = node;
  if (absl::IsUnauthenticated(status)) {
    return WithReason(std::move(status), v1::reason::kNotAuthenticated, md);
  }
  if (absl::IsPermissionDenied(status)) {
    return WithReason(std::move(status), v1::reason::kNotPermitted, md);
  }
  return status;
}

bool CallAuthorizer::IsOperator(const Identity& id) const {
  const AuthConfig& c = options_.config;
  if (std::find(c.operator_users.begin(), c.operator_users.end(), id.username) !=
      c.operator_users.end()) {
    return true;
  }
  return std::any_of(id.groups.begin(), id.groups.end(), [&](const std::string& g) {
    return std::find(c.operator_groups.begin(), c.operator_groups.end(), g) !=
           c.operator_groups.end();
  });
}

absl::StatusOr<CallAuthorizer::Identity> CallAuthorizer::Review(const std::string& token) {
  absl::StatusOr<k8s::ReviewedToken> r = k8s::ReviewToken(kube_, token, options_.config.audiences);
  if (!r.ok()) return r.status();
  Identity id;
  id.authenticated = r->authenticated;
  id.error = r->error;
  if (!id.authenticated) return id;
  id.username = r->username;
  id.groups = r->groups;
  id.node = r->node_name;
  if (id.node.empty() && id.username == options_.config.node_service_account &&
      !r->pod_name.empty() && !r->pod_uid.empty()) {
    // Before Kubernetes 1.30 the token names its pod only: that pod (in the
    // ServiceAccount's namespace) says where it runs.
    const std::vector<std::string> parts = absl::StrSplit(id.username, ':');
    Owner self = Owner::Pod(r->pod_uid, parts.size() == 4 ? parts[2] : "", r->pod_name);
    absl::StatusOr<PodBinding> b = GetPod(kube_, self.pod_namespace, self.pod_name, self.pod_uid);
    if (!b.ok()) return b.status();
    if (b->found) id.node = b->node;
  }
  return id;
}

absl::StatusOr<CallAuthorizer::Identity> CallAuthorizer::Identify(const std::string& token) {
  const std::string key = Sha256(token);
  const absl::Time now = options_.clock->Now();
  {
    absl::MutexLock l(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end() && it->second.expires > now) return it->second.identity;
  }
  absl::StatusOr<Identity> id = Review(token);
  if (!id.ok() || options_.config.cache_ttl <= absl::ZeroDuration()) return id;
  absl::MutexLock l(&mu_);
  if (cache_.size() >= static_cast<size_t>(options_.config.cache_size)) {
    for (auto it = cache_.begin(); it != cache_.end();) {
      if (it->second.expires <= now) {
        cache_.erase(it++);
      } else {
        ++it;
      }
    }
    // Still full: drop any one (the next call for it reviews again).
    if (cache_.size() >= static_cast<size_t>(options_.config.cache_size)) {
      cache_.erase(cache_.begin());
    }
  }
  cache_[key] = Entry{*id, now + options_.config.cache_ttl};
  return id;
}

size_t CallAuthorizer::cached() const {
  absl::MutexLock l(&mu_);
  return cache_.size();
}

absl::Status CallAuthorizer::Check(const CallerInfo& caller, const std::string& method,
                                   const std::string& node, const Owner& owner,
                                   std::string* who) {
  std::string ignored;
  if (who == nullptr) who = &ignored;
  if (caller.local) {
    *who = "local(unix socket)";
    return absl::OkStatus();
  }
  if (caller.bearer.empty()) {
    return Refuse(method,
                  absl::UnauthenticatedError(absl::StrCat(
                      method, ": no caller identity: send a Kubernetes ServiceAccount token as "
                              "`authorization: Bearer TOKEN` (auth.mode token)")),
                  "missing_token", "");
  }
  if (!caller.tls && !options_.config.allow_plaintext_tokens) {
    return Refuse(method,
                  absl::UnauthenticatedError(absl::StrCat(
                      method, ": a token sent without TLS is not accepted (grpc.tls)")),
                  "plaintext_token", "");
  }
  absl::StatusOr<Identity> id = Identify(caller.bearer);
  if (!id.ok()) {
    spdlog::warn("{}: cannot review the caller's token: {}", method, id.status().ToString());
    return Refuse(method,
                  absl::UnavailableError(absl::StrCat(
                      method, ": the caller's token cannot be checked now (Kubernetes API: ",
                      id.status().message(), ")")),
                  "review_unavailable", "");
  }
  if (!id->authenticated) {
    return Refuse(method,
                  absl::UnauthenticatedError(absl::StrCat(
                      method, ": the API server does not accept the caller's token",
                      id->error.empty() ? "" : absl::StrCat(" (", id->error, ")"))),
                  "invalid_token", "");
  }
  if (IsOperator(*id)) {
    *who = absl::StrCat("user=", id->username, " operator");
    return absl::OkStatus();
  }
  if (id->username != options_.config.node_service_account) {
    return Refuse(method,
                  absl::PermissionDeniedError(absl::StrCat(
                      method, ": ", id->username,
                      " is neither duet-node's ServiceAccount nor an operator (auth.*)")),
                  "not_allowed", node);
  }
  if (id->node.empty()) {
    return Refuse(method,
                  absl::PermissionDeniedError(absl::StrCat(
                      method, ": duet-node's token is not bound to a pod on a node (use a "
                              "projected ServiceAccount token)")),
                  "no_node", node);
  }
  if (id->node != node) {
    return Refuse(method,
                  absl::PermissionDeniedError(absl::StrCat(method, ": duet-node of node ",
                                                           id->node, " may not act on node ",
                                                           node)),
                  "wrong_node", node);
  }
  absl::StatusOr<PodBinding> pod = pod_binding_(owner);
  if (!pod.ok()) {
    return Refuse(method,
                  absl::UnavailableError(absl::StrCat(method, ": cannot tell where pod ",
                                                      owner.ToString(), " runs: ",
                                                      pod.status().message())),
                  "review_unavailable", node);
  }
  *who = absl::StrCat("user=", id->username, " node=", id->node);
  if (!pod->found && method == "Release") return absl::OkStatus();
  if (!pod->found || pod->node != node) {
    return Refuse(method,
                  absl::PermissionDeniedError(absl::StrCat(
                      method, ": ", owner.ToString(), " is not bound to node ", node,
                      pod->found ? (pod->node.empty() ? " (not bound yet)"
                                                      : absl::StrCat(" (it runs on ", pod->node, ")"))
                                 : " (no such pod)")),
                  "pod_not_on_node", node);
  }
  return absl::OkStatus();
}

}  // namespace auth
}  // namespace duet
