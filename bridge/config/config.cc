#include "bridge/config/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bridge/config/host_port.h"
#include "bridge/config/yaml_section.h"
#include "bridge/placement/placement.h"
#include "common/yaml/unique_keys.h"
#include "yaml-cpp/yaml.h"

namespace duet {
namespace {

std::string OctalMode(uint32_t mode) {
  char text[16];
  std::snprintf(text, sizeof text, "%04o", mode);
  return text;
}

// A file mode written in octal as chmod takes it ("0660", 0660 or 660):
// YAML would read an unquoted 0660 as decimal or octal depending on the
// version, so the digits are always read as octal here.
absl::Status FileMode(Section* s, const std::string& key, uint32_t* out) {
  std::string text;
  DUET_YAML(s->String(key, &text));
  if (text.empty()) return absl::OkStatus();
  uint32_t mode = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '7' || mode > 0777) {
      mode = ~0u;
      break;
    }
    mode = mode * 8 + static_cast<uint32_t>(ch - '0');
  }
  if (mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        s->Path(key), ": \"", text, "\" must be an octal file mode of 0000..0777, e.g. 0660"));
  }
  *out = mode;
  return absl::OkStatus();
}

absl::Status ParseInto(const YAML::Node& root, Config* c) {
  Section top(root, "");
  DUET_YAML(top.Check());
  {
    Section s(top.Child("grpc"), "grpc");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("listen", &c->grpc.listen));
    DUET_YAML(s.String("unix_socket", &c->grpc.unix_socket));
    DUET_YAML(FileMode(&s, "unix_socket_mode", &c->grpc.unix_socket_mode));
    DUET_YAML(s.Bool("allow_insecure", &c->grpc.allow_insecure));
    DUET_YAML(s.String("plaintext_listen", &c->grpc.plaintext_listen));
    DUET_YAML(s.Int("max_message_bytes", &c->grpc.max_message_bytes));
    DUET_YAML(s.Int("max_concurrent_streams", &c->grpc.max_concurrent_streams));
    DUET_YAML(s.Int("max_watch_streams", &c->grpc.max_watch_streams));
    DUET_YAML(s.Int("max_watch_streams_per_caller", &c->grpc.max_watch_streams_per_caller));
    DUET_YAML(s.Duration("shutdown_grace", &c->grpc.shutdown_grace));
    Section t(s.Child("tls"), "grpc.tls");
    DUET_YAML(t.Check());
    DUET_YAML(t.String("cert_file", &c->grpc.tls.cert_file));
    DUET_YAML(t.String("key_file", &c->grpc.tls.key_file));
    DUET_YAML(t.String("client_ca_file", &c->grpc.tls.client_ca_file));
    DUET_YAML(t.Finish());
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("auth"), "auth");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("mode", &c->auth.mode));
    if (s.Child("audiences")) c->auth.audiences.clear();  // the list replaces the default
    DUET_YAML(s.StringList("audiences", &c->auth.audiences));
    DUET_YAML(s.String("node_service_account", &c->auth.node_service_account));
    DUET_YAML(s.StringList("operator_users", &c->auth.operator_users));
    DUET_YAML(s.StringList("operator_groups", &c->auth.operator_groups));
    DUET_YAML(s.Duration("cache_ttl", &c->auth.cache_ttl));
    DUET_YAML(s.Int("cache_size", &c->auth.cache_size));
    DUET_YAML(s.Bool("allow_plaintext_tokens", &c->auth.allow_plaintext_tokens));
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("metrics"), "metrics");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("listen", &c->metrics.listen));
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("journal"), "journal");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("dir", &c->journal.dir));
    DUET_YAML(s.Bool("fsync", &c->journal.fsync));
    DUET_YAML(s.Int("snapshot_every", &c->journal.snapshot_every));
    Section e(s.Child("etcd"), "journal.etcd");
    DUET_YAML(e.Check());
    DUET_YAML(e.StringList("endpoints", &c->journal.etcd.endpoints));
    DUET_YAML(e.String("prefix", &c->journal.etcd.prefix));
    DUET_YAML(e.Duration("request_timeout", &c->journal.etcd.request_timeout));
    DUET_YAML(e.Duration("commit_timeout", &c->journal.etcd.commit_timeout));
    DUET_YAML(e.Bool("allow_insecure", &c->journal.etcd.allow_insecure));
    Section et(e.Child("tls"), "journal.etcd.tls");
    DUET_YAML(et.Check());
    DUET_YAML(et.String("ca_file", &c->journal.etcd.tls.ca_file));
    DUET_YAML(et.String("cert_file", &c->journal.etcd.tls.cert_file));
    DUET_YAML(et.String("key_file", &c->journal.etcd.tls.key_file));
    DUET_YAML(et.Finish());
    DUET_YAML(e.Finish());
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("inventory"), "inventory");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("source", &c->inventory.source));
    DUET_YAML(s.String("file", &c->inventory.file));
    DUET_YAML(s.Duration("reload_period", &c->inventory.reload_period));
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("kubernetes"), "kubernetes");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("kubeconfig", &c->kubernetes.kubeconfig));
    DUET_YAML(s.String("context", &c->kubernetes.context));
    DUET_YAML(s.String("shared_node_selector", &c->kubernetes.shared_node_selector));
    DUET_YAML(s.Duration("request_timeout", &c->kubernetes.request_timeout));
    DUET_YAML(s.Bool("watch_pods", &c->kubernetes.watch_pods));
    DUET_YAML(s.Duration("pod_release_grace", &c->kubernetes.pod_release_grace));
    DUET_YAML(s.Duration("pod_sweep_period", &c->kubernetes.pod_sweep_period));
    DUET_YAML(s.Int("events_per_minute", &c->kubernetes.events_per_minute));
    {
      LeaderElectionConfig& le = c->kubernetes.leader_election;
      Section l(s.Child("leader_election"), "kubernetes.leader_election");
      DUET_YAML(l.Check());
      DUET_YAML(l.Bool("enabled", &le.enabled));
      DUET_YAML(l.String("namespace", &le.lease_namespace));
      DUET_YAML(l.String("lease_name", &le.lease_name));
      DUET_YAML(l.String("identity", &le.identity));
      DUET_YAML(l.Duration("lease_duration", &le.lease_duration));
      DUET_YAML(l.Duration("renew_deadline", &le.renew_deadline));
      DUET_YAML(l.Duration("retry_period", &le.retry_period));
      DUET_YAML(l.Finish());
    }
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("slurm"), "slurm");
    DUET_YAML(s.Check());
    DUET_YAML(s.Bool("enabled", &c->slurm.enabled));
    DUET_YAML(s.String("conf_path", &c->slurm.conf_path));
    DUET_YAML(s.Duration("call_timeout", &c->slurm.call_timeout));
    DUET_YAML(s.Duration("sync_period", &c->slurm.sync_period));
    DUET_YAML(s.Bool("manage_nodes", &c->slurm.manage_nodes));
    DUET_YAML(s.String("nodes", &c->slurm.nodes));
    DUET_YAML(s.Bool("manage_weights", &c->slurm.manage_weights));
    DUET_YAML(s.Bool("import_jobs", &c->slurm.import_jobs));
    DUET_YAML(s.String("node_addr_label", &c->slurm.node_addr_label));
    DUET_YAML(s.String("managed_feature", &c->slurm.managed_feature));
    DUET_YAML(s.String("block_topology", &c->slurm.block_topology));
    DUET_YAML(s.Duration("release_grace", &c->slurm.release_grace));
    DUET_YAML(s.String("placeholder_partition", &c->slurm.placeholder_partition));
    DUET_YAML(s.String("placeholder_qos", &c->slurm.placeholder_qos));
    DUET_YAML(s.String("preemption", &c->slurm.preemption));
    DUET_YAML(s.Duration("preemption_wait", &c->slurm.preemption_wait));
    DUET_YAML(s.String("credential", &c->slurm.credential));
    DUET_YAML(s.String("key_file", &c->slurm.key_file));
    DUET_YAML(s.Duration("credential_max_age", &c->slurm.credential_max_age));
    if (s.Child("credential_ttl")) {
      // Renamed when it became the bound that makes replay across a leader
      // takeover impossible: an old 5m value would now be refused anyway.
      return absl::InvalidArgumentError(
          "slurm.credential_ttl: replaced by slurm.credential_max_age (unset: at most 10s; it "
          "must be shorter than kubernetes.leader_election.lease_duration)");
    }
    DUET_YAML(s.Bool("require_munge", &c->slurm.require_munge));
    DUET_YAML(s.String("munge_socket", &c->slurm.munge_socket));
    DUET_YAML(s.Int("munge_uid", &c->slurm.munge_uid));
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("placement"), "placement");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("policy", &c->placement.policy));
    Section w(s.Child("workload"), "placement.workload");
    DUET_YAML(w.Check());
    placement::WorkloadModelOptions& wo = c->placement.workload;
    DUET_YAML(w.Duration("half_life", &wo.half_life));
    DUET_YAML(w.Double("coverage", &wo.coverage));
    DUET_YAML(w.Int("max_shapes", &wo.max_shapes));
    DUET_YAML(w.Int("max_tracked", &wo.max_tracked));
    DUET_YAML(w.Int("memory_granularity_mib", &wo.memory_granularity_mib));
    DUET_YAML(w.Duration("refresh", &wo.refresh));
    DUET_YAML(w.Double("min_change", &wo.min_change));
    DUET_YAML(w.Int("max_keys", &wo.max_keys));
    DUET_YAML(w.Int("min_arrivals", &wo.min_arrivals));
    DUET_YAML(w.Finish());
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("extender"), "extender");
    DUET_YAML(s.Check());
    DUET_YAML(s.String("listen", &c->extender.listen));
    DUET_YAML(s.String("url_prefix", &c->extender.url_prefix));
    DUET_YAML(s.Int("max_request_bytes", &c->extender.max_request_bytes));
    DUET_YAML(s.Int("threads", &c->extender.threads));
    DUET_YAML(s.Int("bind_threads", &c->extender.bind_threads));
    DUET_YAML(s.Bool("allow_unauthenticated", &c->extender.allow_unauthenticated));
    if (s.Child("scheduler_names")) {
      // Replaces the default list (StringList appends).
      c->extender.scheduler_names.clear();
      DUET_YAML(s.StringList("scheduler_names", &c->extender.scheduler_names));
    }
    Section t(s.Child("tls"), "extender.tls");
    DUET_YAML(t.Check());
    DUET_YAML(t.String("cert_file", &c->extender.tls.cert_file));
    DUET_YAML(t.String("key_file", &c->extender.tls.key_file));
    DUET_YAML(t.String("client_ca_file", &c->extender.tls.client_ca_file));
    DUET_YAML(t.Finish());
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("dra"), "dra");
    DUET_YAML(s.Check());
    DUET_YAML(s.Bool("enabled", &c->dra.enabled));
    DUET_YAML(s.StringList("pools", &c->dra.pools));
    if (s.Child("drivers")) {
      // Replaces the default list (StringList appends).
      c->dra.drivers.clear();
      DUET_YAML(s.StringList("drivers", &c->dra.drivers));
    }
    DUET_YAML(s.String("taint_key", &c->dra.taint_key));
    DUET_YAML(s.Int("warm_buffer", &c->dra.warm_buffer));
    DUET_YAML(s.Duration("reclaim_after", &c->dra.reclaim_after));
    DUET_YAML(s.String("kube_version", &c->dra.kube_version));
    Section w(s.Child("webhook"), "dra.webhook");
    DUET_YAML(w.Check());
    DUET_YAML(w.String("listen", &c->dra.webhook.listen));
    DUET_YAML(w.Duration("admission_grace", &c->dra.webhook.admission_grace));
    DUET_YAML(w.Int("admission_threads", &c->dra.webhook.admission_threads));
    Section t(w.Child("tls"), "dra.webhook.tls");
    DUET_YAML(t.Check());
    DUET_YAML(t.String("cert_file", &c->dra.webhook.cert_file));
    DUET_YAML(t.String("key_file", &c->dra.webhook.key_file));
    DUET_YAML(t.Finish());
    DUET_YAML(w.Finish());
    DUET_YAML(s.Finish());
  }
  {
    Section s(top.Child("gang"), "gang");
    DUET_YAML(s.Check());
    DUET_YAML(s.Bool("enabled", &c->gang.enabled));
    DUET_YAML(s.Duration("reserve_timeout", &c->gang.reserve_timeout));
    DUET_YAML(s.Duration("idle_release", &c->gang.idle_release));
    DUET_YAML(s.Duration("tick_period", &c->gang.tick_period));
    DUET_YAML(s.Finish());
  }
  DUET_YAML(top.String("log_level", &c->log_level));
  return top.Finish();
}

// A Kubernetes label key: an optional DNS subdomain prefix and "/", then a
// name of at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends.
bool IsLabelKey(const std::string& key) {
  const size_t slash = key.find('/');
  const std::string prefix = slash == std::string::npos ? "" : key.substr(0, slash);
  const std::string name = slash == std::string::npos ? key : key.substr(slash + 1);
  auto alnum = [](char ch) { return absl::ascii_isalnum(static_cast<unsigned char>(ch)); };
  if (name.empty() || name.size() > 63 || !alnum(name.front()) || !alnum(name.back())) return false;
  for (char ch : name) {
    if (!alnum(ch) && ch != '-' && ch != '_' && ch != '.') return false;
  }
  if (slash == std::string::npos) return true;
  if (prefix.empty() || prefix.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(prefix, '.')) {
    if (label.empty() || label.size() > 63 || !alnum(label.front()) || !alnum(label.back())) {
      return false;
    }
    for (char ch : label) {
      if (!(absl::ascii_islower(static_cast<unsigned char>(ch)) ||
            absl::ascii_isdigit(static_cast<unsigned char>(ch)) || ch == '-')) {
        return false;
      }
    }
  }
  return true;
}

absl::Status ValidateDra(const Config& c) {
  const DraConfig& d = c.dra;
  if (!d.enabled) return absl::OkStatus();
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("dra.", field, ": ", why));
  };
  if (d.pools.empty()) {
    return bad("pools", "must name at least one node pool when dra.enabled (the pools that lend)");
  }
  std::set<std::string> seen;
  for (const std::string& p : d.pools) {
    if (p.empty()) return bad("pools", "an empty pool name");
    if (!seen.insert(p).second) return bad("pools", absl::StrCat("\"", p, "\" twice"));
  }
  if (d.drivers.empty()) return bad("drivers", "must name at least one DRA driver");
  static const std::set<std::string> kDrivers = {"gpu.nvidia.com", "tpu.google.com"};
  for (const std::string& drv : d.drivers) {
    if (!kDrivers.count(drv)) {
      return bad("drivers", absl::StrCat("\"", drv,
                                         "\" is not a driver duet can map (gpu.nvidia.com, "
                                         "tpu.google.com)"));
    }
  }
  if (!IsLabelKey(d.taint_key)) {
    return bad("taint_key", absl::StrCat("\"", d.taint_key,
                                         "\" is not a Kubernetes label key (prefix/name)"));
  }
  if (d.warm_buffer < 0 || d.warm_buffer > 1024) return bad("warm_buffer", "must be 0..1024");
  if (d.reclaim_after < absl::Seconds(1)) return bad("reclaim_after", "must be at least 1s");
  if (d.webhook.listen.empty()) {
    return bad("webhook.listen", "required when dra.enabled (kube-apiserver's admission calls)");
  }
  DUET_YAML(CheckHostPort("dra.webhook.listen", d.webhook.listen));
  if (d.webhook.cert_file.empty() || d.webhook.key_file.empty()) {
    return bad("webhook.tls", "cert_file and key_file are required: kube-apiserver calls "
                              "admission webhooks over HTTPS only");
  }
  if (d.webhook.admission_grace < absl::Seconds(1)) {
    return bad("webhook.admission_grace",
               "must be at least 1s (the webhook's timeoutSeconds plus a margin)");
  }
  if (d.webhook.admission_threads < 1 || d.webhook.admission_threads > 256) {
    return bad("webhook.admission_threads", "must be 1..256");
  }
  if (!d.kube_version.empty() && d.kube_version != "1.36" && d.kube_version != "1.37") {
    return bad("kube_version", absl::StrCat("\"", d.kube_version, "\" must be \"\", 1.36 or 1.37"));
  }
  if (!c.slurm.enabled) {
    return bad("enabled", "needs slurm.enabled: a device is lent only while a Slurm placeholder "
                          "holds it");
  }
  return absl::OkStatus();
}

absl::Status ValidateEtcdLog(const EtcdLogConfig& e) {
  // One scheme for every endpoint: TLS settings apply to all of them.
  const bool https = e.endpoints.front().rfind("https://", 0) == 0;
  for (size_t i = 0; i < e.endpoints.size(); ++i) {
    const std::string& u = e.endpoints[i];
    const std::string scheme = https ? "https://" : "http://";
    const std::string rest = u.rfind(scheme, 0) == 0 ? u.substr(scheme.size()) : "";
    if (rest.empty() || rest.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "journal.etcd.endpoints[", i, "]: \"", u, "\" must be ", scheme,
          "host:port (an etcd v3 client URL, no path", i > 0 ? "; one scheme for all" : "", ")"));
    }
  }
  const EtcdLogConfig::Tls& t = e.tls;
  const bool tls_set = !t.ca_file.empty() || !t.cert_file.empty() || !t.key_file.empty();
  if (https) {
    if (t.ca_file.empty()) {
      return absl::InvalidArgumentError(
          "journal.etcd.tls.ca_file: required with https:// endpoints (the CA that signs etcd's "
          "server certificate; the system's store is not used)");
    }
    if (t.cert_file.empty() != t.key_file.empty()) {
      return absl::InvalidArgumentError(
          "journal.etcd.tls: cert_file and key_file must be set together");
    }
    if (e.allow_insecure) {
      return absl::InvalidArgumentError(
          "journal.etcd.allow_insecure: only for http:// endpoints; remove it with https://");
    }
  } else {
    if (tls_set) {
      return absl::InvalidArgumentError(
          absl::StrCat("journal.etcd.tls: set, but journal.etcd.endpoints[0] \"", e.endpoints[0],
                       "\" is plaintext: use https:// endpoints"));
    }
    const std::vector<std::string> open = InsecureEtcdEndpoints(e);
    if (!open.empty() && !e.allow_insecure) {
      return absl::InvalidArgumentError(absl::StrCat(
          "journal.etcd.endpoints: \"", open.front(),
          "\" is plaintext beyond loopback: anyone on the path may read or rewrite the ledger's "
          "log; use https:// with journal.etcd.tls, or set journal.etcd.allow_insecure: true to "
          "accept it"));
    }
  }
  if (e.prefix.empty() || e.prefix.front() != '/' || e.prefix.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "journal.etcd.prefix: \"", e.prefix, "\" must start with / and not end with /"));
  }
  if (e.request_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError("journal.etcd.request_timeout: must be at least 100ms");
  }
  if (e.commit_timeout < e.request_timeout) {
    return absl::InvalidArgumentError(
        "journal.etcd.commit_timeout: must be at least journal.etcd.request_timeout");
  }
  return absl::OkStatus();
}

absl::Status ValidateAuth(const Config& c) {
  const AuthConfig& a = c.auth;
  if (a.mode == "none") return absl::OkStatus();
  if (a.mode != "token") {
    return absl::InvalidArgumentError(
        absl::StrCat("auth.mode: \"", a.mode, "\" must be none or token"));
  }
  if (a.audiences.empty()) {
    return absl::InvalidArgumentError("auth.audiences: name at least one (e.g. duet-bridge)");
  }
  for (size_t i = 0; i < a.audiences.size(); ++i) {
    if (a.audiences[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("auth.audiences[", i, "]: must not be empty"));
    }
  }
  static constexpr char kSaPrefix[] = "system:serviceaccount:";
  const std::string& sa = a.node_service_account;
  const std::vector<std::string> parts = absl::StrSplit(sa, ':');
  if (sa.rfind(kSaPrefix, 0) != 0 || parts.size() != 4 || parts[2].empty() || parts[3].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "auth.node_service_account: \"", sa,
        "\" must be duet-node's ServiceAccount as system:serviceaccount:NAMESPACE:NAME"));
  }
  if (a.cache_ttl < absl::ZeroDuration() || a.cache_ttl > absl::Minutes(5)) {
    return absl::InvalidArgumentError("auth.cache_ttl: must be 0s..5m");
  }
  if (a.cache_size < 1 || a.cache_size > 1000000) {
    return absl::InvalidArgumentError("auth.cache_size: must be 1..1000000");
  }
  if (c.kubernetes.request_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("kubernetes.request_timeout: must be at least 1s");
  }
  // Token mode trusts every call over the unix socket (its file mode is the
  // check), so a socket every local user may connect to would make each of
  // them an operator.
  if (!c.grpc.unix_socket.empty() && (c.grpc.unix_socket_mode & 0002) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc.unix_socket_mode: ", OctalMode(c.grpc.unix_socket_mode),
                     " lets every local user connect, and auth.mode token trusts calls over "
                     "grpc.unix_socket: clear the others' bits (e.g. 0660)"));
  }
  // Whether or not slurm.enabled: the SPANK plugin calls the bridge either
  // way, and a token-checked pod API beside an open Slurm one is no check.
  if (c.slurm.EffectiveCredential() == "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "auth.mode: token with slurm.credential none",
        c.slurm.credential.empty() ? " (slurm.require_munge: false)" : "",
        " would leave Slurm-owned Hold/Release unauthenticated: set slurm.credential to munge "
        "or slurm_key"));
  }
  return absl::OkStatus();
}

// An open door beyond loopback is taken only with grpc.allow_insecure.
absl::Status ValidateOpenDoors(const Config& c) {
  if (c.grpc.allow_insecure) return absl::OkStatus();
  for (const OpenDoor& d : OpenDoors(c)) {
    if (d.reach != "beyond_loopback") continue;
    const std::string fix =
        d.what == "pods"
            ? "set auth.mode: token (with grpc.tls), listen on loopback only"
            : "set slurm.credential: munge or slurm_key, listen on loopback only";
    return absl::InvalidArgumentError(absl::StrCat(d.listener, ": ", d.Describe(), "; ", fix,
                                                   ", or set grpc.allow_insecure: true to "
                                                   "accept it"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackAddress(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  std::string host = colon == std::string::npos ? host_port : host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  // Addresses, not names that look like them ("127.example.com").
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return host == "localhost";
}

std::vector<std::string> InsecureEtcdEndpoints(const EtcdLogConfig& etcd) {
  static constexpr char kHttp[] = "http://";
  std::vector<std::string> out;
  for (const std::string& u : etcd.endpoints) {
    if (u.rfind(kHttp, 0) == 0 && !IsLoopbackAddress(u.substr(sizeof kHttp - 1))) out.push_back(u);
  }
  return out;
}

std::string OpenDoor::Describe() const {
  const std::string who = reach == "beyond_loopback" ? "any peer that reaches it"
                          : reach == "loopback"      ? "any local process"
                                                     : "any local process allowed to connect";
  const std::string setting = what == "pods" ? "auth.mode none" : "slurm.credential none";
  const std::string does = what == "pods"
                               ? "hold and release devices for any pod"
                               : "hold and release devices as any Slurm job or step";
  return absl::StrCat(address, " is ", how, " with ", setting, ": ", who, " may ", does);
}

std::vector<OpenDoor> OpenDoors(const Config& c) {
  struct Listener {
    const char* field;
    std::string address;
    bool tls;
  };
  const bool tls = !c.grpc.tls.cert_file.empty();
  std::vector<Listener> listeners;
  if (!c.grpc.listen.empty()) listeners.push_back({"grpc.listen", c.grpc.listen, tls});
  if (!c.grpc.plaintext_listen.empty()) {
    listeners.push_back({"grpc.plaintext_listen", c.grpc.plaintext_listen, false});
  }
  if (!c.grpc.unix_socket.empty()) {
    listeners.push_back({"grpc.unix_socket", c.grpc.unix_socket, false});
  }
  // auth.mode token trusts the unix socket by design (its file mode is the
  // check); mode none trusts every listener.
  const bool pods_open = c.auth.mode == "none";
  const bool slurm_open = c.slurm.EffectiveCredential() == "none";
  std::vector<OpenDoor> out;
  for (const Listener& l : listeners) {
    const bool unix_socket = l.field == std::string("grpc.unix_socket");
    // A client certificate is a credential: that listener is not open.
    if (l.tls && !c.grpc.tls.client_ca_file.empty()) continue;
    OpenDoor d;
    d.listener = l.field;
    d.address = l.address;
    if (unix_socket) {
      d.reach = "unix_socket";
      d.how = absl::StrCat("a unix socket, mode ", OctalMode(c.grpc.unix_socket_mode));
    } else if (IsLoopbackAddress(l.address)) {
      d.reach = "loopback";
      d.how = l.tls ? "TLS TCP on loopback" : "plaintext TCP on loopback";
    } else {
      d.reach = "beyond_loopback";
      d.how = l.tls ? "TLS TCP beyond loopback without client certificates"
                    : "plaintext TCP beyond loopback";
    }
    if (pods_open) {
      d.what = "pods";
      out.push_back(d);
    }
    if (slurm_open) {
      d.what = "slurm";
      out.push_back(d);
    }
  }
  return out;
}

absl::Duration CredentialMaxAge(const Config& c) {
  if (c.slurm.credential_max_age != absl::ZeroDuration()) return c.slurm.credential_max_age;
  const LeaderElectionConfig& le = c.kubernetes.leader_election;
  if (!le.enabled) return absl::Seconds(10);
  return std::clamp(le.lease_duration - le.renew_deadline, absl::Seconds(1), absl::Seconds(10));
}

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text) {
  Config c;
  // yaml-cpp reports errors by throwing; this is the one place that calls it.
  try {
    YAML::Node root = YAML::Load(yaml_text);
    absl::Status s = CheckUniqueKeys(root);
    if (s.ok()) s = ParseInto(root, &c);
    if (!s.ok()) return s;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: YAML error at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  return c;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, ": cannot be read"));
  std::stringstream buf;
  buf << in.rdbuf();
  absl::StatusOr<Config> c = ParseConfig(buf.str());
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  }
  return c;
}

absl::Status ValidateConfig(const Config& c) {
  if (c.grpc.listen.empty() && c.grpc.unix_socket.empty()) {
    return absl::InvalidArgumentError("grpc: one of listen and unix_socket must be set");
  }
  DUET_YAML(CheckHostPort("grpc.listen", c.grpc.listen));
  DUET_YAML(CheckHostPort("grpc.plaintext_listen", c.grpc.plaintext_listen));
  DUET_YAML(CheckHostPort("metrics.listen", c.metrics.listen));
  if (c.grpc.max_message_bytes < 1024 || c.grpc.max_message_bytes > (64 << 20)) {
    return absl::InvalidArgumentError("grpc.max_message_bytes: must be 1024..67108864");
  }
  if (c.grpc.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError("grpc.max_concurrent_streams: must be at least 1");
  }
  if (c.grpc.max_watch_streams_per_caller < 0) {
    return absl::InvalidArgumentError(
        "grpc.max_watch_streams_per_caller: must be 0 (no per-caller limit) or more");
  }
  if (c.grpc.max_watch_streams < 1) {
    return absl::InvalidArgumentError("grpc.max_watch_streams: must be at least 1");
  }
  if (c.grpc.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("grpc.shutdown_grace: must not be negative");
  }
  if (c.grpc.tls.cert_file.empty() != c.grpc.tls.key_file.empty()) {
    return absl::InvalidArgumentError("grpc.tls: cert_file and key_file must be set together");
  }
  if (!c.grpc.tls.client_ca_file.empty() && c.grpc.tls.cert_file.empty()) {
    return absl::InvalidArgumentError("grpc.tls.client_ca_file: needs cert_file and key_file");
  }
  if (c.grpc.unix_socket_mode > 0777) {
    return absl::InvalidArgumentError("grpc.unix_socket_mode: must be 0000..0777");
  }
  DUET_YAML(ValidateAuth(c));
  DUET_YAML(ValidateOpenDoors(c));
  if (c.journal.etcd.endpoints.empty()) {
    if (c.journal.dir.empty()) return absl::InvalidArgumentError("journal.dir: must be set");
  } else {
    DUET_YAML(ValidateEtcdLog(c.journal.etcd));
  }
  if (c.inventory.source == "file") {
    if (c.inventory.file.empty()) {
      return absl::InvalidArgumentError("inventory.file: must be set when inventory.source is file");
    }
  } else if (c.inventory.source == "kubernetes") {
    if (c.kubernetes.request_timeout < absl::Seconds(1)) {
      return absl::InvalidArgumentError("kubernetes.request_timeout: must be at least 1s");
    }
  } else if (c.inventory.source != "embedded") {
    return absl::InvalidArgumentError(absl::StrCat("inventory.source: \"", c.inventory.source,
                                                   "\" must be kubernetes, file or embedded"));
  }
  if (c.kubernetes.pod_release_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kubernetes.pod_release_grace: must not be negative");
  }
  if (c.kubernetes.pod_sweep_period < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError("kubernetes.pod_sweep_period: must be at least 100ms");
  }
  if (c.kubernetes.events_per_minute > 60000) {
    return absl::InvalidArgumentError("kubernetes.events_per_minute: must be at most 60000");
  }
  if (const LeaderElectionConfig& le = c.kubernetes.leader_election; le.enabled) {
    // The elector's own settings: the elector says what it accepts.
    DUET_YAML(le.Validate("kubernetes.leader_election."));
    if (c.kubernetes.request_timeout < absl::Seconds(1)) {
      return absl::InvalidArgumentError("kubernetes.request_timeout: must be at least 1s");
    }
  }
  if (c.inventory.reload_period < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError("inventory.reload_period: must be at least 100ms");
  }
  if (c.slurm.enabled) {
    if (c.slurm.call_timeout < absl::Milliseconds(100)) {
      return absl::InvalidArgumentError("slurm.call_timeout: must be at least 100ms");
    }
    // The sync's own settings: the sync says what it accepts.
    DUET_YAML(c.slurm.SlurmSyncSettings::Validate("slurm."));
    if (c.slurm.nodes != "create" && c.slurm.nodes != "adopt") {
      return absl::InvalidArgumentError(absl::StrCat(
          "slurm.nodes: \"", c.slurm.nodes,
          "\" must be create (duet makes a dynamic Slurm node per Kubernetes node) or adopt "
          "(each node's slurmd registers itself, as in a Slinky NodeSet)"));
    }
    if (c.slurm.nodes == "adopt" && !c.slurm.manage_nodes) {
      return absl::InvalidArgumentError(
          "slurm.nodes: adopt needs slurm.manage_nodes: true (adopt drains, resumes, weighs and "
          "checks the GRES of the nodes slurmd registered; manage_nodes: false leaves Slurm's "
          "nodes alone): set one of them");
    }
  }
  {
    const std::string& cred = c.slurm.credential;
    if (!cred.empty() && cred != "munge" && cred != "slurm_key" && cred != "none") {
      return absl::InvalidArgumentError(absl::StrCat(
          "slurm.credential: \"", cred, "\" must be munge, slurm_key or none"));
    }
    if (!c.slurm.require_munge && (cred == "munge" || cred == "slurm_key")) {
      return absl::InvalidArgumentError(
          absl::StrCat("slurm.require_munge: false contradicts slurm.credential: ", cred,
                       " (drop require_munge; credential replaces it)"));
    }
    // A credential must be dead before a standby can take over: the replay
    // memory is per process, so one captured before a failover would
    // otherwise be good at the next leader (docs/config.md).
    const absl::Duration max_age = CredentialMaxAge(c);
    if (max_age < absl::Seconds(1)) {
      return absl::InvalidArgumentError("slurm.credential_max_age: must be at least 1s");
    }
    if (max_age > absl::Minutes(5)) {
      return absl::InvalidArgumentError(
          "slurm.credential_max_age: must be at most 5m (munged's own credential TTL)");
    }
    const LeaderElectionConfig& le = c.kubernetes.leader_election;
    if (le.enabled && max_age >= le.lease_duration) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slurm.credential_max_age: ", absl::FormatDuration(max_age),
          " must be shorter than kubernetes.leader_election.lease_duration (",
          absl::FormatDuration(le.lease_duration),
          "), the fastest takeover by a standby: else a credential captured before a failover "
          "could be replayed to the new leader, whose replay memory starts empty"));
    }
  }
  if (absl::Status w = placement::ValidateWorkloadModelOptions(c.placement.workload,
                                                               "placement.workload.");
      !w.ok()) {
    return w;
  }
  // Placement's own registry decides (the name Bridge::Start then parses).
  if (!placement::ParsePolicy(c.placement.policy).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("placement.policy: \"", c.placement.policy,
                                                   "\" must be ", placement::PolicyNamesText()));
  }
  if (c.gang.reserve_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gang.reserve_timeout: must be positive");
  }
  if (c.gang.idle_release <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gang.idle_release: must be positive");
  }
  if (c.gang.tick_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gang.tick_period: must be positive");
  }
  if (!c.extender.listen.empty()) {
    // The extender's own settings: the struct says what it accepts.
    DUET_YAML(c.extender.Validate("extender."));
    // /bind lends duet-bridge's pods/binding permission to whoever calls it:
    // beyond loopback only kube-scheduler's client certificate may, unless
    // the open door is taken on purpose.
    if (c.extender.tls.client_ca_file.empty() && !c.extender.allow_unauthenticated &&
        !IsLoopbackAddress(c.extender.listen)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extender.listen: ", c.extender.listen,
          " is beyond loopback without client certificates: any peer that reaches it may bind "
          "pods to nodes with duet-bridge's permission; set extender.tls.client_ca_file "
          "(kube-scheduler's client CA), listen on loopback only, or set "
          "extender.allow_unauthenticated: true to accept it"));
    }
    if (c.kubernetes.request_timeout < absl::Seconds(1)) {
      return absl::InvalidArgumentError("kubernetes.request_timeout: must be at least 1s");
    }
  }
  DUET_YAML(ValidateDra(c));
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
  if (!kLevels.count(c.log_level)) {
    return absl::InvalidArgumentError(
        absl::StrCat("log_level: \"", c.log_level, "\" must be trace, debug, info, warn or error"));
  }
  return absl::OkStatus();
}

Config DevConfig(const std::string& state_dir) {
  Config c;
  c.grpc.listen = "127.0.0.1:50151";
  c.grpc.unix_socket = absl::StrCat(state_dir, "/bridge.sock");
  c.metrics.listen = "127.0.0.1:9464";
  c.journal.dir = absl::StrCat(state_dir, "/journal");
  c.inventory.source = "embedded";
  return c;
}

}  // namespace duet
