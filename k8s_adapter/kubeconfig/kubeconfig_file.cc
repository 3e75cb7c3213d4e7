#include "k8s_adapter/kubeconfig/kubeconfig_file.h"

#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/yaml/unique_keys.h"
#include "yaml-cpp/yaml.h"

namespace duet {
namespace k8s {
namespace {

std::string Resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return absl::StrCat(base_dir, "/", path);
}

// Finds the entry named `name` in a kubeconfig list (clusters, users,
// contexts) and returns its inner mapping (`cluster:`, `user:`, `context:`).
// Two entries of that name are an error: client-go has taken the last of
// them and other clients the first (kubernetes-client/python#445), so
// taking either would disagree with some kubectl or client on what the
// same file means.
absl::StatusOr<YAML::Node> FindNamed(const YAML::Node& root, const std::string& list,
                                     const std::string& inner, const std::string& name) {
  YAML::Node seq = root[list];
  if (seq && !seq.IsSequence()) return absl::InvalidArgumentError(list + ": must be a list");
  std::optional<size_t> found;
  if (seq) {
    for (size_t i = 0; i < seq.size(); ++i) {
      YAML::Node n = seq[i]["name"];
      if (!n || !n.IsScalar() || n.Scalar() != name) continue;
      if (found) {
        return absl::InvalidArgumentError(absl::StrCat(list, "[", i, "].name: \"", name,
                                                       "\" is also ", list, "[", *found,
                                                       "].name; each name must be unique"));
      }
      found = i;
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(list, ": no entry named \"", name, "\""));
  }
  YAML::Node body = seq[*found][inner];
  if (!body || !body.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(list, "[", *found, "].", inner, ": must be a mapping"));
  }
  return body;
}

std::string Scalar(const YAML::Node& map, const std::string& key) {
  YAML::Node n = map[key];
  return n && n.IsScalar() ? n.Scalar() : "";
}

absl::Status Base64Field(const YAML::Node& map, const std::string& path, const std::string& key,
                         std::string* out) {
  std::string text = Scalar(map, key);
  if (text.empty()) return absl::OkStatus();
  if (!absl::Base64Unescape(text, out)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ".", key, ": not valid base64"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KubeConfig> ParseKubeconfigOrThrow(const std::string& yaml_text,
                                                  const std::string& base_dir,
                                                  const std::string& context_name) {
  YAML::Node root = YAML::Load(yaml_text);
  if (!root.IsMap()) return absl::InvalidArgumentError("kubeconfig: must be a mapping");
  // client-go reads a repeated key as its last value, yaml-cpp as its first:
  // the bridge would talk to another server, or as another user, than
  // kubectl with the same file. Refused instead.
  if (absl::Status s = CheckUniqueKeys(root); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig: ", s.message()));
  }
  std::string ctx_name = context_name.empty() ? Scalar(root, "current-context") : context_name;
  if (ctx_name.empty()) return absl::InvalidArgumentError("current-context: must be set");
  absl::StatusOr<YAML::Node> ctx = FindNamed(root, "contexts", "context", ctx_name);
  if (!ctx.ok()) return ctx.status();
  const std::string cluster_name = Scalar(*ctx, "cluster");
  const std::string user_name = Scalar(*ctx, "user");
  absl::StatusOr<YAML::Node> cluster = FindNamed(root, "clusters", "cluster", cluster_name);
  if (!cluster.ok()) return cluster.status();

  KubeConfig c;
  c.namespace_ = Scalar(*ctx, "namespace");
  const std::string cpath = absl::StrCat("clusters[", cluster_name, "].cluster");
  c.server = Scalar(*cluster, "server");
  if (c.server.empty()) return absl::InvalidArgumentError(cpath + ".server: must be set");
  c.insecure_skip_tls_verify = Scalar(*cluster, "insecure-skip-tls-verify") == "true";
  c.ca_file = Resolve(base_dir, Scalar(*cluster, "certificate-authority"));
  if (absl::Status s = Base64Field(*cluster, cpath, "certificate-authority-data", &c.ca_pem); !s.ok()) {
    return s;
  }
  if (!user_name.empty()) {
    absl::StatusOr<YAML::Node> user = FindNamed(root, "users", "user", user_name);
    if (!user.ok()) return user.status();
    const std::string upath = absl::StrCat("users[", user_name, "].user");
    if ((*user)["exec"] || (*user)["auth-provider"]) {
      return absl::UnimplementedError(upath + ": exec and auth-provider credentials are not supported; "
                                              "use a token or a client certificate");
    }
    c.token = Scalar(*user, "token");
    c.token_file = Resolve(base_dir, Scalar(*user, "tokenFile"));
    c.client_cert_file = Resolve(base_dir, Scalar(*user, "client-certificate"));
    c.client_key_file = Resolve(base_dir, Scalar(*user, "client-key"));
    if (absl::Status s = Base64Field(*user, upath, "client-certificate-data", &c.client_cert_pem);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Base64Field(*user, upath, "client-key-data", &c.client_key_pem); !s.ok()) {
      return s;
    }
    const bool has_cert = !c.client_cert_file.empty() || !c.client_cert_pem.empty();
    const bool has_key = !c.client_key_file.empty() || !c.client_key_pem.empty();
    if (has_cert != has_key) {
      return absl::InvalidArgumentError(upath + ": client certificate and key must be set together");
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<KubeConfig> ParseKubeconfig(const std::string& yaml_text, const std::string& base_dir,
                                           const std::string& context) {
  try {
    return ParseKubeconfigOrThrow(yaml_text, base_dir, context);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig: ", e.what()));
  }
}

absl::StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  std::string dir;
  if (size_t slash = path.rfind('/'); slash != std::string::npos) dir = path.substr(0, slash);
  absl::StatusOr<KubeConfig> c = ParseKubeconfig(*text, dir, context);
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

absl::StatusOr<KubeConfig> ResolveKubeConfig(const std::string& kubeconfig, const std::string& context) {
  if (kubeconfig.empty()) return InClusterConfig();
  return LoadKubeconfig(kubeconfig, context);
}

}  // namespace k8s
}  // namespace duet
