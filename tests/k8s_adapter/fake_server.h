#pragma once

// Runs tests/fakes/fake_apiserver.py on port 0 for one test and drives its
// control API. The process is killed when the object goes away.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {
namespace testing {

struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
  // A client certificate signed by the same CA (CN=duet-bridge).
  std::string client_cert;
  std::string client_key;
};

// openssl: a CA, a server certificate for 127.0.0.1 and a client
// certificate under `dir`.
TlsFiles MakeTestCerts(const std::string& dir);
// A fresh temporary directory (removed by the caller's TempDir).
std::string MakeTempDir();
void RemoveTree(const std::string& dir);
std::string ReadTestdata(const std::string& name);
// Writes a kubeconfig at `path` whose current context reaches `server`
// without credentials, with `ns` as the context's namespace if not empty.
void WriteKubeconfig(const std::string& path, const std::string& server,
                     const std::string& ns = "");

class FakeApiServer {
 public:
  // `args` are extra command-line flags (--token, --tls-cert, ...).
  explicit FakeApiServer(std::vector<std::string> args = {});
  ~FakeApiServer();

  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  std::string url() const;  // http(s)://127.0.0.1:port

  // A plain-HTTP(S) client for the control API (and for tests that want
  // one); uses `ca` when the server is TLS.
  KubeClient* control() { return control_.get(); }

  nlohmann::json Put(const nlohmann::json& object);
  nlohmann::json Delete(const std::string& kind, const std::string& name,
                        const std::string& ns = "default");
  nlohmann::json Control(const std::string& what, const nlohmann::json& body = nlohmann::json::object());
  nlohmann::json Requests();
  int OpenWatches();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool tls_ = false;
  std::unique_ptr<KubeClient> control_;
};

// A Node shaped like `testdata/<golden>` renamed to `name`, with extra labels.
nlohmann::json GoldenNode(const std::string& golden, const std::string& name,
                          const nlohmann::json& extra_labels = nlohmann::json::object());

// fakes::WaitFor (tests/fakes/wait.h) as a bool.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(10));

}  // namespace testing
}  // namespace k8s
}  // namespace duet
