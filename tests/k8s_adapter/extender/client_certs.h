#pragma once

// Client certificates for the extender's mTLS tests, made with the openssl
// CLI at test time (no committed keys).

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace duet {
namespace extender {
namespace testing {

struct ClientCert {
  std::string ca;    // the client CA (extender.tls.client_ca_file)
  std::string cert;  // the client's certificate and key, signed by `ca`
  std::string key;
};

// Shaped like the chart's (templates/scheduler-client-secret.yaml: Helm's
// genCA and genSignedCert): a CA with basicConstraints CA:TRUE and
// keyCertSign, and a leaf for CN=duet-scheduler with the extended key usages
// serverAuth and clientAuth. Files under `dir`, named after `name`; an empty
// result when openssl fails.
inline ClientCert MakeSchedulerClientCert(const std::string& dir, const std::string& name = "sched") {
  const std::string n = name;
  const std::string cmd = absl::StrCat(
      "cd '", dir, "' && ",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ", n, "-ca.key -out ", n,
      "-ca.crt -days 2 -subj /CN=duet-scheduler-client-ca "
      "-addext basicConstraints=critical,CA:TRUE "
      "-addext keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign && ",
      "openssl req -newkey rsa:2048 -nodes -keyout ", n, ".key -out ", n,
      ".csr -subj /CN=duet-scheduler && ",
      "printf 'basicConstraints=critical,CA:FALSE\\nkeyUsage=critical,digitalSignature,"
      "keyEncipherment\\nextendedKeyUsage=serverAuth,clientAuth\\n' > ",
      n, ".cnf && ",
      "openssl x509 -req -in ", n, ".csr -CA ", n, "-ca.crt -CAkey ", n, "-ca.key -CAcreateserial -out ",
      n, ".crt -days 2 -extfile ", n, ".cnf",
      " >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) return {};
  return {absl::StrCat(dir, "/", n, "-ca.crt"), absl::StrCat(dir, "/", n, ".crt"),
          absl::StrCat(dir, "/", n, ".key")};
}

}  // namespace testing
}  // namespace extender
}  // namespace duet
