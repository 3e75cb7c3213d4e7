// The ledger's log in an etcd that speaks only TLS and checks client
// certificates (--client-cert-auth; tests/etcd/etcd_server.h makes the
// certificates with the openssl CLI): the right client certificate reads and
// writes; none, one from another CA, and a server CA that does not sign
// etcd's certificate are refused with errors that say so; bad TLS files are
// refused before anything is sent; certificate files are read again for a
// new connection.

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/etcd/etcd_client.h"
#include "bridge/etcd/etcd_log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd/etcd_server.h"

namespace duet {
namespace {

using ::testing::AllOf;
using testing::EtcdServer;
using ::testing::HasSubstr;

NodeSpec MakeNode(const std::string& name) {
  NodeSpec spec;
  spec.name = name;
  spec.cpus = 64;
  spec.memory_mib = 512 * 1024;
  spec.pool = "a3";
  spec.zone = "us-central1-a";
  for (uint32_t i = 0; i < 4; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.id = absl::StrCat("GPU-", name, "-", i);
    d.model = "nvidia-h100-80gb";
    spec.devices.push_back(d);
  }
  return spec;
}

HoldRequest HoldOne(const std::string& node, const Owner& owner) {
  HoldRequest r;
  r.node = node;
  r.owner = owner;
  r.count = CountSelector{DeviceKind::kGpu, 1, 0, ""};
  return r;
}

void CopyFile(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
}

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdServer::Available()) {
      GTEST_SKIP() << EtcdServer::kBinary << " is missing (Debian package etcd-server)";
    }
    ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Log();
  }

  EtcdLog::Options Opts() {
    EtcdLog::Options o;
    o.endpoints = {etcd_.endpoint()};
    o.tls = etcd_.ClientTls();
    o.prefix = "/duet/tls";
    o.owner = "test";
    o.snapshot_every = 0;
    o.request_timeout = absl::Seconds(2);
    o.commit_timeout = absl::Seconds(5);
    return o;
  }

  // Keys under `prefix` read with the accepted client certificate.
  std::vector<std::string> Keys(const std::string& prefix) {
    etcd::Client c({{etcd_.endpoint()}, absl::Seconds(2), etcd_.ClientTls()});
    auto r = c.Range(prefix, etcd::PrefixEnd(prefix), 0, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::string> keys;
    if (r.ok()) {
      for (const auto& kv : r->kvs) keys.push_back(kv.key);
    }
    return keys;
  }

  // Opens a log with `o` expecting a refusal; nothing may reach etcd.
  absl::Status OpenRefused(const EtcdLog::Options& o) {
    Ledger ledger;
    auto log = EtcdLog::Open(o, &ledger);
    EXPECT_FALSE(log.ok());
    EXPECT_TRUE(Keys("/duet/").empty()) << "a refused client wrote to etcd";
    return log.status();
  }

  EtcdServer etcd_{EtcdServer::Options{/*tls=*/true}};
};

TEST_F(EtcdTlsTest, TheLogAppendsAndRecoversWithTheClientCertificate) {
  ASSERT_EQ(etcd_.endpoint().rfind("https://", 0), 0u);
  Ledger ledger;
  uint64_t seq = 0;
  {
    auto log = EtcdLog::Open(Opts(), &ledger);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE(ledger.UpsertNode(MakeNode("node-0")).ok());
    auto held = ledger.Hold(HoldOne("node-0", Owner::SlurmJob(42)));
    ASSERT_TRUE(held.ok()) << held.status();
    ASSERT_TRUE((*log)->WaitDurable(held->seq).ok());
    seq = held->seq;
    EXPECT_EQ(Keys("/duet/tls/log/").size(), seq);
  }
  Ledger fresh;
  auto log = EtcdLog::Open(Opts(), &fresh);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->stats().recovered_records, seq);
  ASSERT_EQ(fresh.ListHoldings("node-0").size(), 1u);
  EXPECT_EQ(fresh.ListHoldings("node-0")[0].owner.ToString(), Owner::SlurmJob(42).ToString());

  // The port speaks TLS only: a plaintext client gets nothing.
  etcd::Client plain({{absl::StrCat("http://", etcd_.endpoint().substr(8))}, absl::Seconds(2), {}});
  absl::StatusOr<etcd::RangeResult> r = plain.Range("/duet/tls/fence", "", 0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("does it serve https?"));
}

TEST_F(EtcdTlsTest, AClientWithoutACertificateIsRefused) {
  EtcdLog::Options o = Opts();
  o.tls.cert_file.clear();
  o.tls.key_file.clear();
  absl::Status s = OpenRefused(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("refuses a client without a certificate"),
                                 HasSubstr("presents none: set journal.etcd.tls.cert_file")))
      << s;
}

TEST_F(EtcdTlsTest, ACertificateFromAnotherCaIsRefused) {
  EtcdLog::Options o = Opts();
  o.tls.cert_file = etcd_.other_client_cert();
  o.tls.key_file = etcd_.other_client_key();
  absl::Status s = OpenRefused(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("no CA of its --trusted-ca-file signed"),
                                 HasSubstr(etcd_.other_client_cert())))
      << s;
}

TEST_F(EtcdTlsTest, AServerTheCaFileDoesNotSignIsRefused) {
  EtcdLog::Options o = Opts();
  o.tls.ca_file = etcd_.other_ca_file();
  absl::Status s = OpenRefused(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("SSL certificate problem"),
                                 HasSubstr("server certificate is not signed by a CA in "
                                           "journal.etcd.tls.ca_file")))
      << s;
}

TEST_F(EtcdTlsTest, BadTlsSettingsAreRefusedBeforeAnythingIsSent) {
  struct Case {
    std::string name;
    std::function<void(EtcdLog::Options&)> mutate;
    absl::StatusCode code;
    std::string message;
  };
  const std::string missing = "/nonexistent/duet-etcd-tls/client.key";
  const std::vector<Case> cases = {
      {"no CA", [](EtcdLog::Options& o) { o.tls.ca_file.clear(); },
       absl::StatusCode::kInvalidArgument,
       "journal.etcd.tls.ca_file: required with https:// endpoints"},
      {"cert without key", [](EtcdLog::Options& o) { o.tls.key_file.clear(); },
       absl::StatusCode::kInvalidArgument,
       "journal.etcd.tls: cert_file and key_file must be set together"},
      {"unreadable key", [&](EtcdLog::Options& o) { o.tls.key_file = missing; },
       absl::StatusCode::kNotFound, "journal.etcd.tls.key_file: cannot read " + missing},
      {"unreadable CA", [&](EtcdLog::Options& o) { o.tls.ca_file = missing; },
       absl::StatusCode::kNotFound, "journal.etcd.tls.ca_file: cannot read " + missing},
      {"CA not PEM", [&](EtcdLog::Options& o) { o.tls.ca_file = o.tls.key_file; },
       absl::StatusCode::kInvalidArgument, "journal.etcd.tls.ca_file: "},
      {"key of another certificate",
       [&](EtcdLog::Options& o) { o.tls.key_file = etcd_.other_client_key(); },
       absl::StatusCode::kInvalidArgument, "is not the key of journal.etcd.tls.cert_file"},
      {"cert not PEM", [&](EtcdLog::Options& o) { o.tls.cert_file = o.tls.key_file; },
       absl::StatusCode::kInvalidArgument, "journal.etcd.tls.cert_file: "},
      {"TLS with http://",
       [&](EtcdLog::Options& o) {
         o.endpoints = {absl::StrCat("http://", etcd_.endpoint().substr(8))};
       },
       absl::StatusCode::kInvalidArgument,
       "journal.etcd.tls: set, but the endpoints are plaintext"},
      {"mixed schemes", [&](EtcdLog::Options& o) { o.endpoints.push_back("http://127.0.0.1:1"); },
       absl::StatusCode::kInvalidArgument, "endpoints[1]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EtcdLog::Options o = Opts();
    c.mutate(o);
    absl::Status s = OpenRefused(o);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

// libcurl reads the certificate files for every new connection: a client
// whose files are replaced (a rotated Secret) uses the new ones at its next
// connection, with no restart.
TEST_F(EtcdTlsTest, CertificateFilesAreReadAgainForANewConnection) {
  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("duet-etcd-rotate-", ::getpid());
  std::filesystem::create_directories(dir);
  const etcd::TlsOptions good = etcd_.ClientTls();
  CopyFile(etcd_.other_client_cert(), dir + "/tls.crt");
  CopyFile(etcd_.other_client_key(), dir + "/tls.key");
  etcd::TlsOptions tls = good;
  tls.cert_file = dir + "/tls.crt";
  tls.key_file = dir + "/tls.key";
  etcd::Client c({{etcd_.endpoint()}, absl::Seconds(2), tls});
  absl::StatusOr<etcd::RangeResult> before = c.Range("/duet/", "", 0, 0);
  EXPECT_FALSE(before.ok());
  CopyFile(good.cert_file, dir + "/tls.crt");
  CopyFile(good.key_file, dir + "/tls.key");
  absl::StatusOr<etcd::RangeResult> after = c.Range("/duet/", "", 0, 0);
  EXPECT_TRUE(after.ok()) << after.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace duet
