#include "tests/etcd/etcd_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/etcd/etcd_client.h"
#include "tests/fakes/free_port.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace testing {

bool EtcdServer::Available() { return ::access(kBinary, X_OK) == 0; }

EtcdServer::EtcdServer(Options options) : options_(options) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "duet-etcd-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
  client_port_ = fakes::FreePort();
  peer_port_ = fakes::FreePort();
}

EtcdServer::~EtcdServer() {
  Kill();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string EtcdServer::endpoint() const {
  return absl::StrCat(options_.tls ? "https" : "http", "://127.0.0.1:", client_port_);
}

etcd::TlsOptions EtcdServer::ClientTls() const {
  etcd::TlsOptions t;
  if (!options_.tls) return t;
  t.ca_file = ca_file();
  t.cert_file = dir_ + "/pki/client.crt";
  t.key_file = dir_ + "/pki/client.key";
  t.field = "journal.etcd.tls";
  return t;
}

absl::Status EtcdServer::MakeCertificates() {
  const std::string pki = dir_ + "/pki";
  if (std::filesystem::exists(pki + "/client.crt")) return absl::OkStatus();  // a restart
  std::filesystem::create_directories(pki);
  // EC keys: fast to make. etcd 3.4's JSON gateway connects to etcd's own
  // gRPC port presenting the server certificate, so with --client-cert-auth
  // that certificate must be good for client authentication as well.
  const std::string script = absl::StrCat(
      "set -e; cd '", pki,
      "'; exec >openssl.log 2>&1\n"
      "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\"; }\n"
      "ca() { key $1.key; openssl req -x509 -new -key $1.key -out $1.crt -days 2 -subj /CN=$1; }\n"
      "leaf() {  # name ca extensions\n"
      "  key $1.key; openssl req -new -key $1.key -out $1.csr -subj /CN=$1\n"
      "  printf \"$3\" > $1.ext\n"
      "  openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -out $1.crt "
      "-days 2 -extfile $1.ext\n"
      "}\n"
      "ca ca; ca other-ca\n"
      "leaf server ca 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth,"
      "clientAuth\\n'\n"
      "leaf client ca 'extendedKeyUsage=clientAuth\\n'\n"
      "leaf other-client other-ca 'extendedKeyUsage=clientAuth\\n'\n");
  std::ofstream(pki + "/make.sh") << script;
  if (std::system(absl::StrCat("/bin/sh '", pki, "/make.sh'").c_str()) != 0) {
    std::ifstream in(pki + "/openssl.log");
    std::stringstream log;
    log << in.rdbuf();
    return absl::InternalError("etcd test server: openssl could not make the certificates:\n" +
                               log.str());
  }
  return absl::OkStatus();
}

std::string EtcdServer::Log() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status EtcdServer::Start(absl::Duration timeout) {
  if (dir_.empty()) return absl::InternalError("etcd test server: no temporary directory");
  if (pid_ > 0) return absl::OkStatus();
  if (options_.tls) {
    if (absl::Status made = MakeCertificates(); !made.ok()) return made;
  }
  const std::string client = endpoint();
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  const std::string data = dir_ + "/data";
  const std::string log = dir_ + "/etcd.log";
  const std::string cluster = "default=" + peer;
  // Built before fork: the child only execs.
  const std::string pki = dir_ + "/pki";
  const std::string cert = pki + "/server.crt", key = pki + "/server.key", ca = pki + "/ca.crt";
  std::vector<const char*> argv = {kBinary,        "--name",
                                   "default",      "--data-dir",
                                   data.c_str(),   "--listen-client-urls",
                                   client.c_str(), "--advertise-client-urls",
                                   client.c_str(), "--listen-peer-urls",
                                   peer.c_str(),   "--initial-advertise-peer-urls",
                                   peer.c_str(),   "--initial-cluster",
                                   cluster.c_str()};
  if (options_.tls) {
    for (const char* a : {"--client-cert-auth", "--cert-file", cert.c_str(), "--key-file",
                          key.c_str(), "--trusted-ca-file", ca.c_str()}) {
      argv.push_back(a);
    }
  }
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) return absl::InternalError("etcd test server: fork failed");
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(kBinary, const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  etcd::Client::Options o;
  o.endpoints = {client};
  o.request_timeout = absl::Milliseconds(500);
  o.tls = ClientTls();
  etcd::Client c(o);
  const bool up = fakes::WaitFor(
      [&] {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          return true;  // exited: reported below
        }
        return c.Range("/", "", 1, 0).ok();
      },
      timeout, "etcd to answer");
  if (pid_ < 0) return absl::UnavailableError("etcd exited at start:\n" + Log());
  if (!up) {
    Kill();
    return absl::UnavailableError("etcd did not answer in time:\n" + Log());
  }
  return absl::OkStatus();
}

void EtcdServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace testing
}  // namespace duet
