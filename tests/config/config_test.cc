#include "bridge/config/config.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bridge/placement/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, EmptyFileGivesTheDefaults) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->grpc.listen, "127.0.0.1:50151");
  EXPECT_TRUE(c->journal.fsync);
  EXPECT_EQ(c->inventory.source, "kubernetes");
  EXPECT_EQ(c->kubernetes.shared_node_selector, "duet.dev/shared=true");
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);  // in-cluster needs no keys
}

TEST(ConfigTest, FieldsOverrideDefaults) {
  auto c = ParseConfig(R"(
grpc:
  listen: 0.0.0.0:7000
  unix_socket: /run/duet/bridge.sock
  max_message_bytes: 65536
  shutdown_grace: 3s
  tls: {cert_file: a.crt, key_file: a.key, client_ca_file: ca.crt}
journal: {dir: /var/lib/duet, fsync: false, snapshot_every: 10}
inventory: {source: file, file: nodes.yaml, reload_period: 500ms}
metrics: {listen: ""}
log_level: debug
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->grpc.listen, "0.0.0.0:7000");
  EXPECT_EQ(c->grpc.max_message_bytes, 65536);
  EXPECT_EQ(c->grpc.shutdown_grace, absl::Seconds(3));
  EXPECT_EQ(c->grpc.tls.client_ca_file, "ca.crt");
  EXPECT_FALSE(c->journal.fsync);
  EXPECT_EQ(c->journal.snapshot_every, 10u);
  EXPECT_EQ(c->inventory.reload_period, absl::Milliseconds(500));
  EXPECT_EQ(c->metrics.listen, "");
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
}

TEST(ConfigTest, ParseErrorsNameTheKeyPath) {
  EXPECT_THAT(ParseConfig("grpc: {lisen: x}").status().message(), HasSubstr("grpc.lisen: unknown key"));
  EXPECT_THAT(ParseConfig("journal: {fsync: maybe}").status().message(),
              HasSubstr("journal.fsync: must be true or false"));
  EXPECT_THAT(ParseConfig("grpc: {max_message_bytes: lots}").status().message(),
              HasSubstr("grpc.max_message_bytes: must be an integer"));
  EXPECT_THAT(ParseConfig("grpc: {tls: {cert: x}}").status().message(),
              HasSubstr("grpc.tls.cert: unknown key"));
  EXPECT_THAT(ParseConfig("inventory: {reload_period: soon}").status().message(),
              HasSubstr("inventory.reload_period: must be a duration"));
  EXPECT_THAT(ParseConfig("grpc: [1, 2]").status().message(), HasSubstr("grpc: must be a mapping"));
  EXPECT_THAT(ParseConfig("grpc: {listen: [").status().message(), HasSubstr("YAML error at line"));
  EXPECT_THAT(ParseConfig("bogus: 1").status().message(), HasSubstr("bogus: unknown key"));
}

TEST(ConfigTest, ValidationNamesTheField) {
  Config c;
  c.inventory.source = "file";
  c.inventory.file = "nodes.yaml";
  ASSERT_TRUE(ValidateConfig(c).ok());
  auto bad = [&](auto mutate, const std::string& msg) {
    Config copy = c;
    mutate(copy);
    absl::Status s = ValidateConfig(copy);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(msg));
  };
  bad([](Config& x) { x.grpc.listen = "nohostport"; }, "grpc.listen");
  bad([](Config& x) { x.grpc.listen = ""; }, "grpc: one of listen and unix_socket");
  bad([](Config& x) { x.metrics.listen = "h:99999"; }, "metrics.listen");
  bad([](Config& x) { x.grpc.max_message_bytes = 10; }, "grpc.max_message_bytes");
  bad([](Config& x) { x.grpc.tls.cert_file = "a"; }, "grpc.tls: cert_file and key_file");
  bad([](Config& x) { x.grpc.tls.client_ca_file = "a"; }, "grpc.tls.client_ca_file");
  bad([](Config& x) { x.journal.dir = ""; }, "journal.dir");
  bad([](Config& x) { x.inventory.file = ""; }, "inventory.file");
  bad([](Config& x) { x.inventory.source = "etcd"; }, "inventory.source");
  bad([](Config& x) {
    x.inventory.source = "kubernetes";
    x.kubernetes.request_timeout = absl::Milliseconds(5);
  }, "kubernetes.request_timeout");
  bad([](Config& x) { x.log_level = "loud"; }, "log_level");
}

TEST(ConfigTest, JournalEtcdSection) {
  auto c = ParseConfig(R"yaml(
journal:
  etcd:
    endpoints: [http://10.0.0.1:2379, http://10.0.0.2:2379]
    prefix: /duet/prod
    request_timeout: 500ms
    commit_timeout: 3s
    allow_insecure: true
)yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->journal.etcd.endpoints,
            (std::vector<std::string>{"http://10.0.0.1:2379", "http://10.0.0.2:2379"}));
  EXPECT_EQ(c->journal.etcd.prefix, "/duet/prod");
  EXPECT_EQ(c->journal.etcd.request_timeout, absl::Milliseconds(500));
  EXPECT_EQ(c->journal.etcd.commit_timeout, absl::Seconds(3));
  EXPECT_TRUE(c->journal.etcd.allow_insecure);
  c->inventory.source = "embedded";
  c->journal.dir = "";  // unused with etcd
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  // Off by default: the local journal.
  EXPECT_TRUE(Config().journal.etcd.endpoints.empty());

  EXPECT_THAT(ParseConfig("journal: {etcd: {endpoint: x}}").status().message(),
              HasSubstr("journal.etcd.endpoint: unknown key"));
  EXPECT_THAT(ParseConfig("journal: {etcd: {commit_timeout: soon}}").status().message(),
              HasSubstr("journal.etcd.commit_timeout: must be a duration"));
  auto bad = [&](auto mutate, const std::string& msg) {
    Config copy = *c;
    mutate(copy);
    absl::Status s = ValidateConfig(copy);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(msg));
  };
  bad([](Config& x) { x.journal.etcd.endpoints[1] = "10.0.0.2:2379"; }, "journal.etcd.endpoints[1]");
  bad([](Config& x) { x.journal.etcd.endpoints[1] = "https://h:2379"; }, "journal.etcd.endpoints[1]");
  bad([](Config& x) { x.journal.etcd.endpoints[0] = "http://h:2379/v3"; }, "journal.etcd.endpoints[0]");
  bad([](Config& x) { x.journal.etcd.prefix = "duet"; }, "journal.etcd.prefix");
  bad([](Config& x) { x.journal.etcd.prefix = "/duet/"; }, "journal.etcd.prefix");
  bad([](Config& x) { x.journal.etcd.request_timeout = absl::Milliseconds(1); },
      "journal.etcd.request_timeout");
  bad([](Config& x) { x.journal.etcd.commit_timeout = absl::Milliseconds(100); },
      "journal.etcd.commit_timeout");
}

// journal.etcd over TLS with a client certificate; plaintext only on
// loopback or with allow_insecure.
TEST(ConfigTest, JournalEtcdTls) {
  auto c = ParseConfig(R"yaml(
journal:
  dir: ""
  etcd:
    endpoints: [https://etcd-0.etcd:2379, https://10.0.0.2:2379]
    tls:
      ca_file: /etc/duet/etcd-tls/ca.crt
      cert_file: /etc/duet/etcd-tls/tls.crt
      key_file: /etc/duet/etcd-tls/tls.key
inventory: {source: embedded}
)yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->journal.etcd.tls.ca_file, "/etc/duet/etcd-tls/ca.crt");
  EXPECT_EQ(c->journal.etcd.tls.cert_file, "/etc/duet/etcd-tls/tls.crt");
  EXPECT_EQ(c->journal.etcd.tls.key_file, "/etc/duet/etcd-tls/tls.key");
  EXPECT_FALSE(c->journal.etcd.allow_insecure);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  EXPECT_TRUE(InsecureEtcdEndpoints(c->journal.etcd).empty());
  // TLS without a client certificate (etcd without --client-cert-auth).
  Config server_only = *c;
  server_only.journal.etcd.tls.cert_file = server_only.journal.etcd.tls.key_file = "";
  EXPECT_TRUE(ValidateConfig(server_only).ok()) << ValidateConfig(server_only);

  EXPECT_THAT(ParseConfig("journal: {etcd: {tls: {ca: x}}}").status().message(),
              HasSubstr("journal.etcd.tls.ca: unknown key"));
  EXPECT_THAT(ParseConfig("journal: {etcd: {allow_insecure: maybe}}").status().message(),
              HasSubstr("journal.etcd.allow_insecure"));
  auto bad = [&](const Config& base, auto mutate, const std::string& msg) {
    Config copy = base;
    mutate(copy);
    absl::Status s = ValidateConfig(copy);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << msg;
    EXPECT_THAT(s.message(), HasSubstr(msg));
  };
  bad(*c, [](Config& x) { x.journal.etcd.tls.ca_file = ""; },
      "journal.etcd.tls.ca_file: required with https:// endpoints");
  bad(*c, [](Config& x) { x.journal.etcd.tls.key_file = ""; },
      "journal.etcd.tls: cert_file and key_file must be set together");
  bad(*c, [](Config& x) { x.journal.etcd.tls.cert_file = ""; },
      "journal.etcd.tls: cert_file and key_file must be set together");
  bad(*c, [](Config& x) { x.journal.etcd.endpoints[1] = "http://10.0.0.2:2379"; },
      "journal.etcd.endpoints[1]: \"http://10.0.0.2:2379\" must be https://host:port");
  bad(*c, [](Config& x) { x.journal.etcd.allow_insecure = true; },
      "journal.etcd.allow_insecure: only for http:// endpoints");
  bad(*c, [](Config& x) { x.journal.etcd.endpoints = {"http://127.0.0.1:2379"}; },
      "journal.etcd.tls: set, but journal.etcd.endpoints[0] \"http://127.0.0.1:2379\" is "
      "plaintext");

  // Plaintext: loopback needs no flag, anything else allow_insecure.
  Config plain = *c;
  plain.journal.etcd.tls = {};
  plain.journal.etcd.endpoints = {"http://127.0.0.1:2379", "http://localhost:2380",
                                  "http://[::1]:2381"};
  EXPECT_TRUE(ValidateConfig(plain).ok()) << ValidateConfig(plain);
  EXPECT_TRUE(InsecureEtcdEndpoints(plain.journal.etcd).empty());
  plain.journal.etcd.endpoints.push_back("http://etcd.duet-system.svc:2379");
  bad(plain, [](Config&) {},
      "journal.etcd.endpoints: \"http://etcd.duet-system.svc:2379\" is plaintext beyond "
      "loopback");
  EXPECT_EQ(InsecureEtcdEndpoints(plain.journal.etcd),
            std::vector<std::string>{"http://etcd.duet-system.svc:2379"});
  plain.journal.etcd.allow_insecure = true;
  EXPECT_TRUE(ValidateConfig(plain).ok()) << ValidateConfig(plain);
}

TEST(ConfigTest, KubernetesSection) {
  auto c = ParseConfig(R"yaml(
inventory: {source: kubernetes}
kubernetes: {kubeconfig: /root/.kube/config, context: dev, shared_node_selector: "pool in (a,b)",
             request_timeout: 30s}
)yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kubernetes.kubeconfig, "/root/.kube/config");
  EXPECT_EQ(c->kubernetes.context, "dev");
  EXPECT_EQ(c->kubernetes.shared_node_selector, "pool in (a,b)");
  EXPECT_EQ(c->kubernetes.request_timeout, absl::Seconds(30));
  EXPECT_TRUE(ValidateConfig(*c).ok());
  EXPECT_THAT(ParseConfig("kubernetes: {kube_config: x}").status().message(),
              HasSubstr("kubernetes.kube_config: unknown key"));
}

// Config validation asks placement's registry: a policy placement knows is
// never refused by validation, and the message lists exactly the registry.
TEST(ConfigTest, EveryRegisteredPlacementPolicyValidates) {
  ASSERT_FALSE(placement::RegisteredPolicies().empty());
  for (const placement::PolicyEntry& e : placement::RegisteredPolicies()) {
    for (const char* name : {e.name, e.alias}) {
      if (name == nullptr) continue;
      auto c = ParseConfig(absl::StrCat("placement: {policy: ", name, "}"));
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_TRUE(ValidateConfig(*c).ok()) << name << ": " << ValidateConfig(*c);
      EXPECT_EQ(*placement::ParsePolicy(c->placement.policy), e.policy) << name;
    }
  }
  auto c = ParseConfig("placement: {policy: random}");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(ValidateConfig(*c).message(),
            "placement.policy: \"random\" must be duet, spread, most-allocated, best-fit or fgd");
}

// The Slurm sync's and the leader elector's settings are declared once, in
// their subsystems: the config's defaults are theirs, and the subsystem's
// Validate() decides, named under the config's field path.
TEST(ConfigTest, SubsystemSettingsAreEmbeddedAndValidatedByTheSubsystem) {
  const Config c;
  const SlurmSyncSettings sync;
  EXPECT_EQ(c.slurm.sync_period, sync.sync_period);
  EXPECT_EQ(c.slurm.release_grace, sync.release_grace);
  EXPECT_EQ(c.slurm.managed_feature, sync.managed_feature);
  EXPECT_EQ(c.slurm.node_addr_label, sync.node_addr_label);
  const k8s::LeaderElectionOptions elector;
  EXPECT_EQ(c.kubernetes.leader_election.lease_name, elector.lease_name);
  EXPECT_EQ(c.kubernetes.leader_election.lease_duration, elector.lease_duration);
  EXPECT_EQ(c.kubernetes.leader_election.renew_deadline, elector.renew_deadline);
  EXPECT_EQ(c.kubernetes.leader_election.retry_period, elector.retry_period);

  auto slurm = ParseConfig("slurm: {enabled: true, release_grace: -1s}");
  ASSERT_TRUE(slurm.ok()) << slurm.status();
  EXPECT_EQ(ValidateConfig(*slurm).message(),
            slurm->slurm.SlurmSyncSettings::Validate("slurm.").message());
  EXPECT_EQ(ValidateConfig(*slurm).message(), "slurm.release_grace: must not be negative");

  auto le = ParseConfig(R"yaml(
kubernetes:
  leader_election: {enabled: true, namespace: ops, renew_deadline: 20s}
)yaml");
  ASSERT_TRUE(le.ok()) << le.status();
  EXPECT_EQ(le->kubernetes.leader_election.lease_namespace, "ops");
  EXPECT_EQ(ValidateConfig(*le).message(),
            "kubernetes.leader_election.lease_duration: must be longer than renew_deadline");
}

TEST(ConfigTest, PlacementAndExtenderSections) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->placement.policy, "duet");
  EXPECT_EQ(d->extender.listen, "");  // off by default
  EXPECT_EQ(d->extender.url_prefix, "/duet");
  EXPECT_EQ(d->extender.max_request_bytes, 8388608);
  EXPECT_EQ(d->extender.threads, 2);
  EXPECT_EQ(d->extender.bind_threads, 16);

  auto c = ParseConfig(R"yaml(
placement: {policy: fgd}
extender:
  listen: 0.0.0.0:8443
  url_prefix: /sched
  tls: {cert_file: e.crt, key_file: e.key, client_ca_file: sched-ca.crt}
  max_request_bytes: 1048576
  threads: 4
  bind_threads: 32
)yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->placement.policy, "fgd");
  EXPECT_EQ(c->extender.listen, "0.0.0.0:8443");
  EXPECT_EQ(c->extender.url_prefix, "/sched");
  EXPECT_EQ(c->extender.tls.cert_file, "e.crt");
  EXPECT_EQ(c->extender.tls.key_file, "e.key");
  EXPECT_EQ(c->extender.max_request_bytes, 1048576);
  EXPECT_EQ(c->extender.threads, 4);
  EXPECT_EQ(c->extender.bind_threads, 32);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);

  EXPECT_THAT(ParseConfig("extender: {tls: {cert: x}}").status().message(),
              HasSubstr("extender.tls.cert: unknown key"));
  EXPECT_THAT(ParseConfig("placement: {policies: x}").status().message(),
              HasSubstr("placement.policies: unknown key"));
  auto bad = [&](const char* yaml, const char* field) {
    auto x = ParseConfig(yaml);
    ASSERT_TRUE(x.ok()) << x.status();
    absl::Status v = ValidateConfig(*x);
    EXPECT_FALSE(v.ok()) << yaml;
    EXPECT_THAT(std::string(v.message()), HasSubstr(field)) << yaml;
  };
  bad("placement: {policy: random}", "placement.policy");
  bad("extender: {listen: nope}", "extender.listen");
  bad("extender: {listen: \"0.0.0.0:8443\", url_prefix: duet}", "extender.url_prefix");
  bad("extender: {listen: \"0.0.0.0:8443\", tls: {cert_file: a}}", "extender.tls");
  bad("extender: {listen: \"0.0.0.0:8443\", max_request_bytes: 10}", "extender.max_request_bytes");
  bad("extender: {listen: \"0.0.0.0:8443\", threads: 0}", "extender.threads");
  bad("extender: {listen: \"0.0.0.0:8443\", bind_threads: 300}", "extender.bind_threads");
}

TEST(ConfigTest, ExtenderSettingsAreCheckedWithTheirFieldPath) {
  auto message = [](const char* yaml) {
    auto c = ParseConfig(yaml);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::string(ValidateConfig(*c).message()) : std::string();
  };
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0:8443\", threads: 0}"),
            "extender.threads: must be 1..64");
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0:8443\", threads: 65}"),
            "extender.threads: must be 1..64");
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0\"}"),
            "extender.listen: \"0.0.0.0\" must be host:port, e.g. 127.0.0.1:50151");
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0:https\"}"),
            "extender.listen: \"0.0.0.0:https\" must be host:port, e.g. 127.0.0.1:50151");
  // Off (no listen): the other settings are not read, so not checked.
  EXPECT_EQ(message("extender: {threads: 0}"), "");

  // The struct checks itself under any prefix; its defaults (off) pass.
  ExtenderSettings x;
  EXPECT_TRUE(x.Validate().ok());
  x.listen = "[::1]:8443";
  EXPECT_TRUE(x.Validate("extender.").ok());
  x.url_prefix = "duet";
  EXPECT_EQ(x.Validate("e.").message(), "e.url_prefix: \"duet\" must be empty or a path starting with /");
}

// /bind lends duet-bridge's pods/binding permission: beyond loopback only a
// client certificate may call it, or the open door is taken on purpose;
// client certificates need HTTPS; bind acts for the listed schedulers only.
TEST(ConfigTest, ExtenderCallersAreAuthenticated) {
  auto message = [](const std::string& yaml) {
    auto c = ParseConfig(yaml);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::string(ValidateConfig(*c).message()) : std::string();
  };
  const std::string tls = "tls: {cert_file: e.crt, key_file: e.key";
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0:8443\", " + tls + "}}"),
            "extender.listen: 0.0.0.0:8443 is beyond loopback without client certificates: any "
            "peer that reaches it may bind pods to nodes with duet-bridge's permission; set "
            "extender.tls.client_ca_file (kube-scheduler's client CA), listen on loopback only, "
            "or set extender.allow_unauthenticated: true to accept it");
  EXPECT_THAT(message("extender: {listen: \"10.0.0.5:8443\"}"),
              HasSubstr("extender.allow_unauthenticated: true"));
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0:8443\", " + tls + ", client_ca_file: ca.crt}}"),
            "");
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0:8443\", allow_unauthenticated: true}"), "");
  // Loopback: only local processes reach it.
  EXPECT_EQ(message("extender: {listen: \"127.0.0.1:8443\"}"), "");
  EXPECT_EQ(message("extender: {listen: \"[::1]:8443\"}"), "");
  // No client authentication over plain HTTP.
  EXPECT_EQ(message("extender: {listen: \"0.0.0.0:8443\", tls: {client_ca_file: ca.crt}}"),
            "extender.tls.client_ca_file: client certificates are checked only over HTTPS; set "
            "tls.cert_file and tls.key_file too");
  EXPECT_THAT(ParseConfig("extender: {allow_unauthenticated: maybe}").status().message(),
              HasSubstr("extender.allow_unauthenticated"));

  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->extender.scheduler_names, std::vector<std::string>{"duet"});
  EXPECT_FALSE(d->extender.allow_unauthenticated);
  auto c = ParseConfig("extender: {scheduler_names: [gpu-a, gpu-b]}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->extender.scheduler_names, (std::vector<std::string>{"gpu-a", "gpu-b"}));
  EXPECT_EQ(message("extender: {listen: \"127.0.0.1:8443\", scheduler_names: []}"),
            "extender.scheduler_names: name at least one (the schedulerName of duet's profile)");
  EXPECT_EQ(message("extender: {listen: \"127.0.0.1:8443\", scheduler_names: [duet, \"\"]}"),
            "extender.scheduler_names[1]: must not be empty");
  EXPECT_THAT(ParseConfig("extender: {scheduler_names: duet}").status().message(),
              HasSubstr("extender.scheduler_names: must be a list of strings"));
}

TEST(ConfigTest, LearnedWorkloadSection) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->placement.workload.half_life, absl::Hours(6));
  EXPECT_EQ(d->placement.workload.max_shapes, 128u);
  EXPECT_DOUBLE_EQ(d->placement.workload.coverage, 0.95);

  auto c = ParseConfig(R"yaml(
placement:
  workload: {half_life: inf, coverage: 0.9, max_shapes: 64, max_tracked: 256,
             memory_granularity_mib: 4096, refresh: 250ms, max_keys: 1000, min_arrivals: 7,
             min_change: 0.05}
)yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const placement::WorkloadModelOptions& w = c->placement.workload;
  EXPECT_EQ(w.half_life, absl::InfiniteDuration());
  EXPECT_DOUBLE_EQ(w.coverage, 0.9);
  EXPECT_EQ(w.max_shapes, 64u);
  EXPECT_EQ(w.max_tracked, 256u);
  EXPECT_EQ(w.memory_granularity_mib, 4096u);
  EXPECT_EQ(w.refresh, absl::Milliseconds(250));
  EXPECT_EQ(w.max_keys, 1000u);
  EXPECT_EQ(w.min_arrivals, 7u);
  EXPECT_DOUBLE_EQ(w.min_change, 0.05);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);

  EXPECT_THAT(ParseConfig("placement: {workload: {coverage: most}}").status().message(),
              HasSubstr("placement.workload.coverage: must be a number"));
  EXPECT_THAT(ParseConfig("placement: {workload: {halflife: 1h}}").status().message(),
              HasSubstr("placement.workload.halflife: unknown key"));
  auto invalid = [](const char* yaml) {
    auto x = ParseConfig(yaml);
    EXPECT_TRUE(x.ok()) << x.status();
    return x.ok() ? std::string(ValidateConfig(*x).message()) : std::string();
  };
  EXPECT_THAT(invalid("placement: {workload: {coverage: 1.5}}"),
              HasSubstr("placement.workload.coverage: must be in (0, 1]"));
  EXPECT_THAT(invalid("placement: {workload: {max_shapes: 200, max_tracked: 100}}"),
              HasSubstr("placement.workload.max_tracked: must be at least max_shapes"));
  EXPECT_THAT(invalid("placement: {workload: {half_life: 0s}}"),
              HasSubstr("placement.workload.half_life: must be positive"));
}

TEST(ConfigTest, SlurmSection) {
  auto c = ParseConfig(R"(
inventory: {source: file, file: n.yaml}
slurm: {enabled: true, conf_path: /etc/slurm/slurm.conf, call_timeout: 2s, sync_period: 1s,
        manage_weights: false, managed_feature: duet-gke, release_grace: 0s}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->slurm.enabled);
  EXPECT_EQ(c->slurm.conf_path, "/etc/slurm/slurm.conf");
  EXPECT_EQ(c->slurm.call_timeout, absl::Seconds(2));
  EXPECT_FALSE(c->slurm.manage_weights);
  EXPECT_TRUE(c->slurm.manage_nodes);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->slurm.sync_period = absl::Milliseconds(1);
  EXPECT_THAT(ValidateConfig(*c).message(), HasSubstr("slurm.sync_period"));
  EXPECT_THAT(ParseConfig("slurm: {enable: true}").status().message(),
              HasSubstr("slurm.enable: unknown key"));
}

TEST(ConfigTest, SlurmBlockTopology) {
  auto c = ParseConfig(R"(
inventory: {source: file, file: n.yaml}
slurm: {enabled: true, block_topology: default}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.block_topology, "default");
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->slurm.block_topology = "default:b1";
  EXPECT_THAT(ValidateConfig(*c).message(), HasSubstr("slurm.block_topology"));
  c->slurm.block_topology = "two words";
  EXPECT_THAT(ValidateConfig(*c).message(), HasSubstr("slurm.block_topology"));
}

TEST(ConfigTest, SlurmNodesCreateOrAdopt) {
  const std::string base = "inventory: {source: file, file: n.yaml}\n";
  auto c = ParseConfig(base + "slurm: {enabled: true}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.nodes, "create");
  c = ParseConfig(base + "slurm: {enabled: true, nodes: adopt}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.nodes, "adopt");
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->slurm.manage_nodes = false;
  EXPECT_THAT(ValidateConfig(*c).message(),
              HasSubstr("slurm.nodes: adopt needs slurm.manage_nodes: true"));
  c->slurm.nodes = "create";  // manage_nodes: false alone: leave Slurm's nodes alone
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c = ParseConfig(base + "slurm: {enabled: true, nodes: slinky}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(ValidateConfig(*c).message(), HasSubstr("slurm.nodes: \"slinky\" must be create"));
}

TEST(ConfigTest, SlurmPreemptionProtectOrEvictPods) {
  const std::string base = "inventory: {source: file, file: n.yaml}\n";
  auto c = ParseConfig(base + "slurm: {enabled: true}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.preemption, "protect");
  EXPECT_EQ(c->slurm.preemption_wait, absl::Minutes(5));
  c = ParseConfig(base + "slurm: {enabled: true, preemption: evict-pods, preemption_wait: 90s}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.preemption, "evict-pods");
  EXPECT_EQ(c->slurm.preemption_wait, absl::Seconds(90));
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->slurm.preemption = "requeue";
  EXPECT_THAT(ValidateConfig(*c).message(),
              HasSubstr("slurm.preemption: \"requeue\" is not one of protect, evict-pods"));
  c->slurm.preemption = "evict-pods";
  c->slurm.preemption_wait = absl::Hours(2);
  EXPECT_THAT(ValidateConfig(*c).message(),
              HasSubstr("slurm.preemption_wait: must be between 1s and 1h"));
}

// auth.mode none and slurm.credential none leave mutations open to whoever
// reaches a listener: beyond loopback only with grpc.allow_insecure, and
// Slurm's credential is asked for whether or not slurm.enabled.
TEST(ConfigTest, OpenDoorsBeyondLoopbackNeedAllowInsecure) {
  const std::string base = "inventory: {source: embedded}\n";
  auto message = [&](const std::string& yaml) {
    auto c = ParseConfig(base + yaml);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::string(ValidateConfig(*c).message()) : "";
  };
  // No auth section: mode none, refused on a plaintext TCP listener others reach.
  EXPECT_EQ(message("grpc: {listen: \"0.0.0.0:50151\"}"),
            "grpc.listen: 0.0.0.0:50151 is plaintext TCP beyond loopback with auth.mode none: "
            "any peer that reaches it may hold and release devices for any pod; set auth.mode: "
            "token (with grpc.tls), listen on loopback only, or set grpc.allow_insecure: true "
            "to accept it");
  EXPECT_THAT(message("grpc: {plaintext_listen: \"10.1.2.3:50152\"}"),
              HasSubstr("grpc.plaintext_listen: 10.1.2.3:50152 is plaintext TCP beyond loopback "
                        "with auth.mode none"));
  // TLS alone is no credential; client certificates are.
  EXPECT_THAT(message("grpc: {listen: \"[::]:50151\", tls: {cert_file: a, key_file: b}}"),
              HasSubstr("grpc.listen: [::]:50151 is TLS TCP beyond loopback without client "
                        "certificates with auth.mode none"));
  EXPECT_EQ(message("grpc: {listen: \"[::]:50151\", tls: {cert_file: a, key_file: b, "
                    "client_ca_file: c}}"),
            "");
  // Loopback and the unix socket are no reason to refuse (development).
  for (const char* ok : {"grpc: {listen: \"127.0.0.1:1\"}", "grpc: {listen: \"localhost:1\"}",
                         "grpc: {listen: \"[::1]:1\"}",
                         "grpc: {listen: \"\", unix_socket: /run/duet/b.sock}"}) {
    EXPECT_EQ(message(ok), "") << ok;
  }
  EXPECT_EQ(message("grpc: {listen: \"0.0.0.0:50151\", allow_insecure: true}"), "");
  // slurm.credential none (or require_munge: false), Slurm on or off: on
  // loopback as it is, beyond it only with allow_insecure (auth.mode none is
  // then open there too, and named first).
  for (const char* slurm : {"slurm: {credential: none}", "slurm: {require_munge: false}",
                            "slurm: {enabled: true, credential: none}"}) {
    EXPECT_EQ(message(absl::StrCat("grpc: {listen: \"127.0.0.1:1\"}\n", slurm)), "") << slurm;
    EXPECT_THAT(message(absl::StrCat("grpc: {listen: \"0.0.0.0:1\"}\n", slurm)),
                HasSubstr("grpc.allow_insecure: true"))
        << slurm;
    auto c = ParseConfig(
        absl::StrCat(base, "grpc: {listen: \"0.0.0.0:1\", allow_insecure: true}\n", slurm));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(ValidateConfig(*c).ok()) << slurm << ": " << ValidateConfig(*c);
    const std::vector<OpenDoor> doors = OpenDoors(*c);
    ASSERT_EQ(doors.size(), 2u) << slurm;
    EXPECT_EQ(doors[1].listener + " " + doors[1].Describe(),
              "grpc.listen 0.0.0.0:1 is plaintext TCP beyond loopback with slurm.credential none: "
              "any peer that reaches it may hold and release devices as any Slurm job or step");
  }
}

TEST(ConfigTest, TokenModeNeedsASlurmCredentialWithOrWithoutSlurm) {
  const std::string token =
      "inventory: {source: embedded}\n"
      "auth: {mode: token, node_service_account: \"system:serviceaccount:duet:duet-node\"}\n";
  auto message = [&](const std::string& yaml) {
    auto c = ParseConfig(token + yaml);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::string(ValidateConfig(*c).message()) : "";
  };
  EXPECT_EQ(message(""), "");  // the default credential, munge
  EXPECT_EQ(message("slurm: {credential: none}"),
            "auth.mode: token with slurm.credential none would leave Slurm-owned Hold/Release "
            "unauthenticated: set slurm.credential to munge or slurm_key");
  EXPECT_EQ(message("slurm: {require_munge: false}"),
            "auth.mode: token with slurm.credential none (slurm.require_munge: false) would leave "
            "Slurm-owned Hold/Release unauthenticated: set slurm.credential to munge or "
            "slurm_key");
  EXPECT_THAT(message("slurm: {enabled: true, credential: none}"),
              HasSubstr("auth.mode: token with slurm.credential none"));
  // Token mode trusts the unix socket: every local user must not reach it.
  EXPECT_EQ(message("grpc: {unix_socket: /run/duet/b.sock, unix_socket_mode: \"0666\"}"),
            "grpc.unix_socket_mode: 0666 lets every local user connect, and auth.mode token "
            "trusts calls over grpc.unix_socket: clear the others' bits (e.g. 0660)");
  EXPECT_EQ(message("grpc: {unix_socket: /run/duet/b.sock, unix_socket_mode: \"0664\"}"), "");
}

TEST(ConfigTest, UnixSocketModeIsOctal) {
  EXPECT_EQ(Config().grpc.unix_socket_mode, 0660u);
  for (const char* text : {"0600", "600", "\"0600\""}) {
    auto c = ParseConfig(absl::StrCat("grpc: {unix_socket_mode: ", text, "}"));
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    EXPECT_EQ(c->grpc.unix_socket_mode, 0600u) << text;
  }
  for (const char* bad : {"0668", "rw-rw----", "01777", "-1"}) {
    EXPECT_THAT(ParseConfig(absl::StrCat("grpc: {unix_socket_mode: \"", bad, "\"}"))
                    .status()
                    .message(),
                HasSubstr("grpc.unix_socket_mode: \"" + std::string(bad) +
                          "\" must be an octal file mode of 0000..0777, e.g. 0660"))
        << bad;
  }
}

TEST(ConfigTest, OpenDoorsNameEveryOpenListener) {
  Config c = DevConfig("/tmp/x");
  std::vector<std::string> lines;
  for (const OpenDoor& d : OpenDoors(c)) lines.push_back(d.listener + " " + d.Describe());
  EXPECT_THAT(lines, ::testing::ElementsAre(
                         "grpc.listen 127.0.0.1:50151 is plaintext TCP on loopback with auth.mode "
                         "none: any local process may hold and release devices for any pod",
                         "grpc.unix_socket /tmp/x/bridge.sock is a unix socket, mode 0660 with "
                         "auth.mode none: any local process allowed to connect may hold and "
                         "release devices for any pod"));
  c.slurm.credential = "none";
  c.grpc.listen = "";
  ASSERT_EQ(OpenDoors(c).size(), 2u);
  EXPECT_EQ(OpenDoors(c)[1].what, "slurm");
  EXPECT_EQ(OpenDoors(c)[1].reach, "unix_socket");
  c.auth.mode = "token";  // trusts the socket: no door for pods
  ASSERT_EQ(OpenDoors(c).size(), 1u);
  EXPECT_EQ(OpenDoors(c)[0].what, "slurm");
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.2:1"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:1"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:1"));
  EXPECT_FALSE(IsLoopbackAddress("127.example.com:1"));
  EXPECT_FALSE(IsLoopbackAddress("localhost.evil.com:1"));
}

TEST(ConfigTest, DevConfigIsValid) {
  Config c = DevConfig("/tmp/x");
  EXPECT_TRUE(ValidateConfig(c).ok());
  EXPECT_EQ(c.inventory.source, "embedded");
  EXPECT_EQ(c.journal.dir, "/tmp/x/journal");
}

// Issue 25, item 7: "A YAML key given twice is silently dropped." yaml-cpp
// keeps both entries and reads the first, so the second `fsync: false` or
// `cert_file:` would be ignored without a word. Refused at every level,
// naming the key's path and both lines; nothing of the file is taken.
TEST(ConfigTest, KeyGivenTwiceIsRefusedAtEveryLevel) {
  auto top = ParseConfig("journal: {dir: /a}\nmetrics: {listen: x}\njournal: {fsync: false}\n");
  EXPECT_EQ(top.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(top.status().message(),
            "journal: key given twice in one mapping (line 1 and line 3); YAML keeps only one "
            "of them, so the file is refused");

  auto nested = ParseConfig(R"(
grpc:
  listen: 0.0.0.0:7000
  tls:
    cert_file: good.crt
    key_file: a.key
    cert_file: evil.crt
)");
  EXPECT_THAT(nested.status().message(),
              HasSubstr("grpc.tls.cert_file: key given twice in one mapping (line 5 and line 7)"));

  // Flow style, a known key, and keys where the loader never looks (an
  // unknown key given twice is named as given twice, not as unknown).
  EXPECT_THAT(ParseConfig("journal: {fsync: true, fsync: false}").status().message(),
              HasSubstr("journal.fsync: key given twice in one mapping (line 1 and line 1)"));
  EXPECT_THAT(ParseConfig("auth: {audiences: [a], mode: token, mode: none}").status().message(),
              HasSubstr("auth.mode: key given twice"));
  EXPECT_THAT(ParseConfig("bogus: 1\nbogus: 2").status().message(),
              HasSubstr("bogus: key given twice in one mapping (line 1 and line 2)"));
  // Inside a list of mappings.
  EXPECT_THAT(ParseConfig("auth: {operator_users: [{a: 1, a: 2}]}").status().message(),
              HasSubstr("auth.operator_users[0].a: key given twice"));

  // The same key in different mappings, and an alias of a mapping used
  // twice, are no repeats.
  auto fine = ParseConfig(R"(
grpc: {listen: "127.0.0.1:1", tls: &t {cert_file: a.crt, key_file: a.key}}
metrics: {listen: "127.0.0.1:2"}
)");
  EXPECT_TRUE(fine.ok()) << fine.status();
}

// A document of nested aliases (the "billion laughs") is checked once per
// node, not once per path: refused (not a mapping of known keys) at once.
TEST(ConfigTest, NestedAliasesAreCheckedOncePerNode) {
  std::string doc = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 40; ++i) {
    absl::StrAppend(&doc, "a", i, ": &a", i, " [*a", i - 1, ", *a", i - 1, ", *a", i - 1, ", *a",
                    i - 1, "]\n");
  }
  absl::StrAppend(&doc, "a0: dup\n");
  const absl::Time start = absl::Now();
  auto c = ParseConfig(doc);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(c.status().message(), HasSubstr("a0: key given twice in one mapping (line 1 and "
                                              "line 41)"));
}

TEST(ConfigTest, GangSection) {
  auto message = [](const std::string& yaml) -> std::string {
    auto c = ParseConfig(yaml);
    if (!c.ok()) return std::string(c.status().message());
    return std::string(ValidateConfig(*c).message());
  };
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->gang.enabled);
  EXPECT_EQ(d->gang.reserve_timeout, absl::Seconds(300));
  EXPECT_EQ(d->gang.idle_release, absl::Seconds(60));
  EXPECT_EQ(d->gang.tick_period, absl::Seconds(5));
  auto c = ParseConfig(
      "gang: {enabled: false, reserve_timeout: 2m, idle_release: 90s, tick_period: 250ms}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(ValidateConfig(*c).message(), "");
  EXPECT_FALSE(c->gang.enabled);
  EXPECT_EQ(c->gang.reserve_timeout, absl::Minutes(2));
  EXPECT_EQ(c->gang.idle_release, absl::Seconds(90));
  EXPECT_EQ(c->gang.tick_period, absl::Milliseconds(250));
  EXPECT_THAT(message("gang: {tick_period: 0s}"), HasSubstr("gang.tick_period: must be positive"));
  EXPECT_THAT(message("gang: {reserve_timeout: 0s}"), HasSubstr("gang.reserve_timeout: must be positive"));
  EXPECT_THAT(message("gang: {idle_release: -1s}"), HasSubstr("gang.idle_release: must be positive"));
  EXPECT_THAT(message("gang: {reserve: 1s}"), HasSubstr("gang"));
}

TEST(ConfigTest, DraSection) {
  auto message = [](const std::string& yaml) -> std::string {
    auto c = ParseConfig(yaml);
    if (!c.ok()) return std::string(c.status().message());
    return std::string(ValidateConfig(*c).message());
  };
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->dra.enabled);
  EXPECT_EQ(d->dra.drivers, (std::vector<std::string>{"gpu.nvidia.com", "tpu.google.com"}));
  EXPECT_EQ(d->dra.taint_key, "duet.dev/not-lent");
  EXPECT_EQ(d->dra.webhook.admission_grace, absl::Seconds(15));
  EXPECT_EQ(d->dra.webhook.admission_threads, 16);

  const std::string slurm = "slurm: {enabled: true, credential: none}\n";
  const std::string good =
      "dra: {enabled: true, pools: [gpu-a, tpu-b], drivers: [gpu.nvidia.com], warm_buffer: 2,\n"
      "      reclaim_after: 30s, kube_version: \"1.36\",\n"
      "      webhook: {listen: \"0.0.0.0:9443\", admission_grace: 20s, admission_threads: 4,\n"
      "                tls: {cert_file: w.crt, key_file: w.key}}}\n";
  auto c = ParseConfig(slurm + good);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(ValidateConfig(*c).message(), "");
  EXPECT_TRUE(c->dra.enabled);
  EXPECT_EQ(c->dra.pools, (std::vector<std::string>{"gpu-a", "tpu-b"}));
  EXPECT_EQ(c->dra.drivers, std::vector<std::string>{"gpu.nvidia.com"});
  EXPECT_EQ(c->dra.warm_buffer, 2);
  EXPECT_EQ(c->dra.reclaim_after, absl::Seconds(30));
  EXPECT_EQ(c->dra.webhook.listen, "0.0.0.0:9443");
  EXPECT_EQ(c->dra.webhook.cert_file, "w.crt");
  EXPECT_EQ(c->dra.webhook.admission_grace, absl::Seconds(20));
  EXPECT_EQ(c->dra.webhook.admission_threads, 4);
  EXPECT_EQ(c->dra.kube_version, "1.36");

  // Off: nothing else is checked.
  EXPECT_EQ(message("dra: {pools: []}"), "");
  const std::string on = "dra: {enabled: true, ";
  const std::string hook = "webhook: {listen: \"0.0.0.0:9443\", tls: {cert_file: c, key_file: k}}";
  EXPECT_THAT(message(slurm + on + hook + "}"), HasSubstr("dra.pools: must name at least one"));
  EXPECT_THAT(message(slurm + on + "pools: [a, a], " + hook + "}"),
              HasSubstr("dra.pools: \"a\" twice"));
  EXPECT_THAT(message(slurm + on + "pools: [a], drivers: [gpu.amd.com], " + hook + "}"),
              HasSubstr("dra.drivers: \"gpu.amd.com\" is not a driver duet can map"));
  EXPECT_THAT(message(slurm + on + "pools: [a], taint_key: \"bad key!\", " + hook + "}"),
              HasSubstr("dra.taint_key"));
  EXPECT_EQ(message(slurm + on + "pools: [a], taint_key: example.com/lent, " + hook + "}"), "");
  EXPECT_THAT(message(slurm + on + "pools: [a], warm_buffer: -1, " + hook + "}"),
              HasSubstr("dra.warm_buffer"));
  EXPECT_THAT(message(slurm + on + "pools: [a]}"),
              HasSubstr("dra.webhook.listen: required when dra.enabled"));
  EXPECT_THAT(message(slurm + on + "pools: [a], webhook: {listen: \"0.0.0.0:9443\"}}"),
              HasSubstr("dra.webhook.tls: cert_file and key_file are required"));
  EXPECT_THAT(message(slurm + on + "pools: [a], webhook: {listen: nohost, tls: {cert_file: c, "
                                   "key_file: k}}}"),
              HasSubstr("dra.webhook.listen"));
  for (const char* n : {"0", "257"}) {
    EXPECT_THAT(message(slurm + on + "pools: [a], webhook: {listen: \"0.0.0.0:9443\", " +
                        "admission_threads: " + n + ", tls: {cert_file: c, key_file: k}}}"),
                HasSubstr("dra.webhook.admission_threads: must be 1..256"));
  }
  EXPECT_THAT(message(slurm + on + "pools: [a], kube_version: \"1.35\", " + hook + "}"),
              HasSubstr("dra.kube_version"));
  EXPECT_THAT(message(on + "pools: [a], " + hook + "}"), HasSubstr("needs slurm.enabled"));
  EXPECT_THAT(ParseConfig("dra: {webhook: {tls: {ca: x}}}").status().message(),
              HasSubstr("dra.webhook.tls.ca"));
}

}  // namespace
}  // namespace duet
