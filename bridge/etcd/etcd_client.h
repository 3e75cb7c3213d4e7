#pragma once

// A small client of etcd's v3 KV API through its JSON gRPC gateway
// (POST /v3/kv/{range,txn,deleterange} over HTTP or HTTPS, libcurl +
// nlohmann_json). Keys and values are raw bytes here; the client
// base64-encodes them on the wire as the gateway requires. Only what EtcdLog
// needs.
//
// TLS (https:// endpoints): etcd's server certificate is verified against
// TlsOptions::ca_file only (not the system store), and the client presents
// cert_file/key_file when set (etcd's --client-cert-auth). libcurl reads the
// three files again for every new connection (connections are kept alive
// between requests), so a rotated certificate is picked up at the next
// reconnect without a restart. CheckTls reads and parses them up front.
//
// Thread-compatible: one request at a time per object (it keeps one curl
// handle, so connections are reused); give each thread its own client.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace duet {
namespace etcd {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
};

// One operation of a transaction's success branch.
struct Op {
  enum class Type { kPut, kDeleteRange };
  Type type = Type::kPut;
  std::string key;
  std::string value;      // kPut
  std::string range_end;  // kDeleteRange: [key, range_end); empty: the key alone
  static Op Put(std::string k, std::string v) {
    return Op{Type::kPut, std::move(k), std::move(v), ""};
  }
  static Op DeleteRange(std::string k, std::string end) {
    return Op{Type::kDeleteRange, std::move(k), "", std::move(end)};
  }
};

struct TxnResult {
  bool succeeded = false;  // the compare held and the ops were applied
  int64_t revision = 0;    // the store's revision after the txn
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  bool more = false;      // more keys in the range than `limit`
  int64_t revision = 0;   // the revision the range was read at
};

// The key just past every key with `prefix` (etcd's "prefix" range end).
std::string PrefixEnd(const std::string& prefix);

// PEM files for https:// endpoints. All empty: no TLS.
struct TlsOptions {
  // The CA certificates that sign etcd's server certificate (required for
  // https://; the system's store is never used).
  std::string ca_file;
  // The client certificate (chain) and its private key, set together; empty:
  // no client certificate.
  std::string cert_file;
  std::string key_file;
  // Where these came from, for errors: "<field>.ca_file: ..." (a config path
  // such as "journal.etcd.tls").
  std::string field = "tls";

  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// Checks `endpoints` against `tls` (one scheme for all; https:// needs
// ca_file; http:// takes no TLS files; cert_file and key_file together),
// then reads every file and parses it: ca_file must hold at least one PEM
// certificate, cert_file a PEM certificate, key_file a PEM private key that
// belongs to it. Errors name the field: NOT_FOUND for a file that cannot be
// read, INVALID_ARGUMENT otherwise.
absl::Status CheckTls(const std::vector<std::string>& endpoints, const TlsOptions& tls);

class Client {
 public:
  struct Options {
    std::vector<std::string> endpoints;  // http(s)://host:port, tried in turn
    absl::Duration request_timeout = absl::Seconds(2);
    TlsOptions tls;  // for https:// endpoints; see CheckTls
  };
  explicit Client(Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Keys in [key, range_end) (range_end empty: `key` alone), at most `limit`
  // (0: all) in key order, read at `revision` (0: the newest).
  absl::StatusOr<RangeResult> Range(const std::string& key, const std::string& range_end,
                                    int64_t limit, int64_t revision);

  // If `fence_key`'s mod_revision equals `fence_revision` (fence_key empty:
  // unconditionally), applies `ops` atomically. Not succeeded is not an error.
  absl::StatusOr<TxnResult> Txn(const std::string& fence_key, int64_t fence_revision,
                                const std::vector<Op>& ops);

  // Errors: UNAVAILABLE when no endpoint answered (connection refused, timed
  // out, a TLS handshake that failed: its message says which side refused
  // which certificate) or etcd answered it is unavailable (no leader,
  // timeouts); otherwise the gateway's gRPC code (e.g. INVALID_ARGUMENT "too
  // many operations").
 private:
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& body);

  const Options options_;
  void* curl_ = nullptr;  // CURL*
  size_t next_endpoint_ = 0;
};

}  // namespace etcd
}  // namespace duet
