#pragma once

// gRPC TLS credentials from PEM files, for duet-bridge's server and its
// clients (duet-node, duetctl). Errors name the config field or flag that
// gave the file.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace duet {

// A PEM file and the config field or flag that named it ("--ca-file",
// "grpc.tls.cert_file"). An empty path: not given.
struct PemFile {
  std::string path;
  std::string what;
};

// Client credentials: `ca` the roots to trust (none: gRPC's default roots),
// `cert` and `key` the client's certificate and key (none: no client
// certificate). Which combinations are valid is the caller's to check; a file
// that cannot be read is a status of `code`.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const PemFile& ca, const PemFile& cert, const PemFile& key,
    absl::StatusCode code = absl::StatusCode::kNotFound);

// Server credentials: without `cert`, insecure ones. Otherwise TLS with
// `cert` and `key`; with `client_ca` too, clients must present a certificate
// it signed. A file that cannot be read is NOT_FOUND.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const PemFile& cert, const PemFile& key, const PemFile& client_ca);

}  // namespace duet
