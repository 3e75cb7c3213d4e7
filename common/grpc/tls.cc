#include "common/grpc/tls.h"

#include <utility>

#include "common/file.h"

namespace duet {

namespace {

absl::StatusOr<std::string> ReadPem(const PemFile& file,
                                    absl::StatusCode code = absl::StatusCode::kNotFound) {
  return ReadFileToString(file.path, code, file.what);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const PemFile& ca, const PemFile& cert, const PemFile& key, absl::StatusCode code) {
  grpc::SslCredentialsOptions ssl;
  if (!ca.path.empty()) {
    absl::StatusOr<std::string> roots = ReadPem(ca, code);
    if (!roots.ok()) return roots.status();
    ssl.pem_root_certs = *std::move(roots);
  }
  if (!cert.path.empty()) {
    absl::StatusOr<std::string> chain = ReadPem(cert, code);
    if (!chain.ok()) return chain.status();
    absl::StatusOr<std::string> private_key = ReadPem(key, code);
    if (!private_key.ok()) return private_key.status();
    ssl.pem_cert_chain = *std::move(chain);
    ssl.pem_private_key = *std::move(private_key);
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const PemFile& cert, const PemFile& key, const PemFile& client_ca) {
  if (cert.path.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts;
  absl::StatusOr<std::string> chain = ReadPem(cert);
  if (!chain.ok()) return chain.status();
  absl::StatusOr<std::string> private_key = ReadPem(key);
  if (!private_key.ok()) return private_key.status();
  opts.pem_key_cert_pairs.push_back({*std::move(private_key), *std::move(chain)});
  if (!client_ca.path.empty()) {
    absl::StatusOr<std::string> roots = ReadPem(client_ca);
    if (!roots.ok()) return roots.status();
    opts.pem_root_certs = *std::move(roots);
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

}  // namespace duet
