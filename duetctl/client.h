#pragma once

// duetctl's connection to duet-bridge: channel creation (insecure, unix socket
// or TLS) and the calls it makes. Every error comes back as an absl::Status
// with the call's canonical code and a message that tells an operator what to
// do ("cannot reach duet-bridge at ADDR: ... Is it running? Set --server or
// DUET_SERVER.").

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace duet::ctl {

// Used when neither --server nor DUET_SERVER is given.
inline constexpr char kDefaultServer[] = "unix:///run/duet/bridge.sock";
inline constexpr char kServerEnv[] = "DUET_SERVER";

struct ClientOptions {
  // A gRPC target: "unix:///path", "host:port", "dns:///host:port". A bare
  // absolute path ("/run/duet/bridge.sock") is taken as a unix socket.
  std::string server = kDefaultServer;
  // Deadline of each unary call. Watches have none.
  absl::Duration timeout = absl::Seconds(5);
  // TLS is used when ca_file is set; cert_file and key_file (both or
  // neither) add a client certificate.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// `server` as a gRPC target (a bare absolute path becomes "unix://PATH").
std::string ChannelTarget(const std::string& server);

// Makes the channel. INVALID_ARGUMENT when the TLS options are inconsistent
// or a file cannot be read (the message names the flag). Does not connect.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options);

// Turns a failed call into a Status whose message says what to do. `node` is
// the node a NOT_FOUND refers to (empty: none).
absl::Status ExplainRpcError(const grpc::Status& status, const ClientOptions& options,
                             const std::string& method, const std::string& node = "");

// A running WatchNodes stream. Events are read on a gRPC thread and queued;
// the caller takes them with Next. Thread-safe. The destructor cancels the
// stream and waits for it to finish.
class NodeWatch {
 public:
  enum class Result { kEvent, kTimeout, kDone };

  NodeWatch(const NodeWatch&) = delete;
  NodeWatch& operator=(const NodeWatch&) = delete;
  ~NodeWatch();

  // Waits up to `timeout` for the next event. kEvent: *event is set. kDone:
  // the stream ended and every event was taken; status() says why.
  Result Next(absl::Duration timeout, v1::NodeEvent* event);
  // Ends the stream; Next returns kDone with OK once the queue is drained.
  void Cancel();
  // After kDone: OK when the server ended the stream or Cancel was called,
  // else the explained error.
  absl::Status status() const;

 private:
  friend class Client;
  class Reactor;
  NodeWatch() = default;

  mutable absl::Mutex mu_;
  std::deque<v1::NodeEvent> events_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Reactor> reactor_;
};

// The calls duetctl makes. Thread-safe (gRPC stubs are).
class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // Empty `names`: every node. Unknown names are left out of the answer,
  // whether the server omits them or refuses the list with NOT_FOUND.
  absl::StatusOr<v1::ListNodesResponse> ListNodes(const std::vector<std::string>& names);
  // NOT_FOUND: "no node named X (duetctl nodes lists them)".
  absl::StatusOr<v1::Node> GetNode(const std::string& name);
  // Empty `node`: every node.
  absl::StatusOr<v1::ListHoldingsResponse> ListHoldings(const std::string& node);
  absl::StatusOr<v1::WorkloadResponse> GetWorkload();
  // Starts a watch; errors (unreachable server, ...) arrive through it.
  std::unique_ptr<NodeWatch> WatchNodes(const std::vector<std::string>& names);

  const ClientOptions& options() const { return options_; }

 private:
  void SetDeadline(grpc::ClientContext* context) const;
  // One unary call under the deadline; an error explained by
  // ExplainRpcError(method, node).
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (v1::Ledger::Stub::*rpc)(grpc::ClientContext*,
                                                                      const Request&, Response*),
                                const Request& request, const std::string& method,
                                const std::string& node);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
  ClientOptions options_;
};

}  // namespace duet::ctl
