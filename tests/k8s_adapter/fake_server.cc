#include "tests/k8s_adapter/fake_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/fakes/wait.h"

extern char** environ;

namespace duet {
namespace k8s {
namespace testing {

std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "duet-k8s-XXXXXX").string();
  char* d = mkdtemp(tmpl.data());
  return d ? std::string(d) : "";
}

void WriteKubeconfig(const std::string& path, const std::string& server, const std::string& ns) {
  std::ofstream(path) << "apiVersion: v1\nkind: Config\n"
                      << "clusters: [{name: fake, cluster: {server: \"" << server << "\"}}]\n"
                      << "users: [{name: dev, user: {}}]\n"
                      << "contexts: [{name: fake, context: {cluster: fake, user: dev"
                      << (ns.empty() ? "" : ", namespace: " + ns) << "}}]\n"
                      << "current-context: fake\n";
}

void RemoveTree(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

std::string ReadTestdata(const std::string& name) {
  std::ifstream in(std::string(DUET_K8S_TESTDATA) + "/" + name);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TlsFiles MakeTestCerts(const std::string& dir) {
  const std::string q = absl::StrCat("cd '", dir, "' && ");
  // Shaped so that strict verifiers accept them too (Python 3.13's default
  // VERIFY_X509_STRICT, which kube-apiserver's fake uses in the newer Debian
  // roots): the CA has keyUsage, the leaves an authority key identifier.
  const std::string cmd = absl::StrCat(
      q,
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 "
      "-subj /CN=duet-test-ca -addext basicConstraints=critical,CA:TRUE "
      "-addext keyUsage=critical,keyCertSign,cRLSign && "
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 && "
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nauthorityKeyIdentifier=keyid\\n"
      "keyUsage=critical,digitalSignature,keyEncipherment\\nextendedKeyUsage=serverAuth\\n' "
      "> ext.cnf && "
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt "
      "-days 2 -extfile ext.cnf && "
      "printf 'authorityKeyIdentifier=keyid\\nkeyUsage=critical,digitalSignature\\n"
      "extendedKeyUsage=clientAuth\\n' > client.cnf && "
      "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=duet-bridge && "
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt "
      "-days 2 -extfile client.cnf",
      " >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) return {};
  return {dir + "/ca.crt", dir + "/server.crt", dir + "/server.key", dir + "/client.crt",
          dir + "/client.key"};
}

FakeApiServer::FakeApiServer(std::vector<std::string> args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;
  std::vector<std::string> argv_s = {"/usr/bin/python3", DUET_FAKE_APISERVER, "--port", "0",
                                     "--parent-pid", std::to_string(getpid())};
  for (const std::string& a : args) {
    if (a == "--tls-cert") tls_ = true;
    argv_s.push_back(a);
  }
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  std::string line;
  pollfd p{fds[0], POLLIN, 0};
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (pid_ > 0 && line.find('\n') == std::string::npos && absl::Now() < deadline) {
    if (poll(&p, 1, 100) > 0) {
      char buf[64];
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, n);
    }
  }
  close(fds[0]);
  if (line.rfind("PORT ", 0) == 0) port_ = std::atoi(line.c_str() + 5);
  KubeConfig c;
  c.server = url();
  c.insecure_skip_tls_verify = tls_;
  auto client = NewCurlKubeClient(c);
  if (client.ok()) control_ = *std::move(client);
}

FakeApiServer::~FakeApiServer() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::string FakeApiServer::url() const {
  return absl::StrCat(tls_ ? "https" : "http", "://127.0.0.1:", port_);
}

nlohmann::json FakeApiServer::Control(const std::string& what, const nlohmann::json& body) {
  absl::StatusOr<std::string> r = what == "requests" || what == "stats"
                                      ? control_->Get("/_fake/" + what)
                                      : control_->Post("/_fake/" + what, body.dump());
  if (!r.ok()) return {{"error", std::string(r.status().ToString())}};
  return nlohmann::json::parse(*r, nullptr, false);
}

nlohmann::json FakeApiServer::Put(const nlohmann::json& object) { return Control("put", object); }

nlohmann::json FakeApiServer::Delete(const std::string& kind, const std::string& name,
                                     const std::string& ns) {
  return Control("delete", {{"kind", kind}, {"name", name}, {"namespace", ns}});
}

nlohmann::json FakeApiServer::Requests() { return Control("requests"); }

int FakeApiServer::OpenWatches() {
  nlohmann::json s = Control("stats");
  return s.is_object() ? s.value("watches", -1) : -1;
}

nlohmann::json GoldenNode(const std::string& golden, const std::string& name,
                          const nlohmann::json& extra_labels) {
  nlohmann::json n = nlohmann::json::parse(ReadTestdata(golden));
  n["metadata"]["name"] = name;
  n["metadata"]["labels"]["kubernetes.io/hostname"] = name;
  for (const char* k : {"uid", "resourceVersion", "creationTimestamp"}) n["metadata"].erase(k);
  for (const auto& [k, v] : extra_labels.items()) n["metadata"]["labels"][k] = v;
  return n;
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  return static_cast<bool>(fakes::WaitFor(done, timeout));
}

}  // namespace testing
}  // namespace k8s
}  // namespace duet
