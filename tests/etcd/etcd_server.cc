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

#include "absl/strings/str_cat.h"
#include "bridge/etcd/etcd_client.h"
#include "tests/fakes/free_port.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace testing {

bool EtcdServer::Available() { return ::access(kBinary, X_OK) == 0; }

EtcdServer::EtcdServer() {
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
  return absl::StrCat("http://127.0.0.1:", client_port_);
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
  const std::string client = endpoint();
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  const std::string data = dir_ + "/data";
  const std::string log = dir_ + "/etcd.log";
  const std::string cluster = "default=" + peer;
  pid_ = ::fork();
  if (pid_ < 0) return absl::InternalError("etcd test server: fork failed");
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execl(kBinary, kBinary, "--name", "default", "--data-dir", data.c_str(),
            "--listen-client-urls", client.c_str(), "--advertise-client-urls", client.c_str(),
            "--listen-peer-urls", peer.c_str(), "--initial-advertise-peer-urls", peer.c_str(),
            "--initial-cluster", cluster.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  etcd::Client::Options o;
  o.endpoints = {client};
  o.request_timeout = absl::Milliseconds(500);
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
