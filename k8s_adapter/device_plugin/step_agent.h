#pragma once

// duet-node's step agent (--step-agent-socket): the node-local end of
// spank_duet's agent path. slurmstepd connects to a unix socket, sends one
// request (common/step_agent/step_wire.h: Hold or Release of a Slurm step's
// GPUs, with the step's credential), and reads one reply. The agent makes the
// same duet.v1.Ledger call on duet-node's long-lived channel to duet-bridge,
// with the step's credential as the same gRPC metadata the gRPC client would
// send, and answers with the bridge's code, message, reason and metadata
// unchanged. It forwards; it never vouches: the bridge checks the credential
// exactly as on the gRPC path, and the plugin decides on the reason.
//
// So a step pays no gRPC, protobuf or Abseil in slurmstepd: a connect, two
// small writes and reads, and the bridge's own call.
//
// The socket is created 0600 (root: slurmstepd raises its effective uid for
// the call, as for the bridge's socket); its directory is the hostPath shared
// by duet-node's pod and slurmd's (charts/duet, node-daemonset.yaml).
//
// Thread-safety: Start/Stop from one thread. One thread accepts; each
// connection is served on its own short-lived thread, at most kMaxInFlight at
// once (a connection beyond that is answered UNAVAILABLE at once, which the
// plugin treats as an unreachable bridge: plugstack on_unreachable).

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/step_agent/step_wire.h"
#include "duet/v1/duet.pb.h"
#include "grpcpp/support/status.h"

namespace duet {
namespace node {

// One call to forward, made from a request by StepCallOf.
struct StepCall {
  bool hold = false;           // Hold; else Release
  v1::HoldRequest hold_request;
  v1::ReleaseRequest release_request;
  std::string credential_key;  // gRPC metadata key; "" = none sent
  std::string credential;
  absl::Duration timeout;
};

// Makes the call to the bridge and returns its status (the Ledger's answer).
using StepForwarder = std::function<grpc::Status(const StepCall&)>;

// The Ledger call a decoded request names (owner slurm_step or slurm_job,
// GPUs as whole devices in the order given), its credential's metadata key
// (slurm_munge::kMetadataKey, slurm_key::kMetadataKey) and the request's
// timeout (else `default_timeout`).
StepCall StepCallOf(const duet_wire_request& request, absl::Duration default_timeout);

// The reply for the bridge's answer: code, "Hold: message" as the gRPC
// client's FromGrpc words it, reason and metadata. Longer values than the
// wire carries are cut (the message with "..."; metadata past 8 dropped).
duet_wire_reply ReplyOf(const grpc::Status& status, const char* method);

class StepAgent {
 public:
  static constexpr int kMaxInFlight = 64;

  // Binds `socket_path` (an old socket file there is replaced) and starts
  // accepting. Errors name the path.
  static absl::StatusOr<std::unique_ptr<StepAgent>> Start(const std::string& socket_path,
                                                          StepForwarder forward,
                                                          absl::Duration default_timeout);
  ~StepAgent();
  StepAgent(const StepAgent&) = delete;
  StepAgent& operator=(const StepAgent&) = delete;

  // Stops accepting, waits for the calls in flight, removes the socket.
  // Idempotent.
  void Stop();

 private:
  StepAgent(std::string socket_path, int fd, StepForwarder forward,
            absl::Duration default_timeout);
  void AcceptLoop();
  void Serve(int conn);

  const std::string socket_path_;
  const int listen_fd_;
  const StepForwarder forward_;
  const absl::Duration default_timeout_;
  std::thread accept_thread_;

  // Shared with each connection's thread, which leaves it last (after its
  // count is down, Stop may destroy the agent).
  struct Flights {
    absl::Mutex mu;
    bool stopping ABSL_GUARDED_BY(mu) = false;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
  };
  const std::shared_ptr<Flights> flights_ = std::make_shared<Flights>();
};

}  // namespace node
}  // namespace duet
