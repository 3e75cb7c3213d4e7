#pragma once

// A small client of etcd's v3 KV API through its JSON gRPC gateway
// (POST /v3/kv/{range,txn,deleterange} over HTTP, libcurl + nlohmann_json).
// Keys and values are raw bytes here; the client base64-encodes them on the
// wire as the gateway requires. Only what EtcdLog needs.
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

class Client {
 public:
  struct Options {
    std::vector<std::string> endpoints;  // http://host:port, tried in turn
    absl::Duration request_timeout = absl::Seconds(2);
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
  // out) or etcd answered it is unavailable (no leader, timeouts); otherwise
  // the gateway's gRPC code (e.g. INVALID_ARGUMENT "too many operations").
 private:
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& body);

  const Options options_;
  void* curl_ = nullptr;  // CURL*
  size_t next_endpoint_ = 0;
};

}  // namespace etcd
}  // namespace duet
