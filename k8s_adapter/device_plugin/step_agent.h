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
// Releases are off the step's path: a Release (of a step, or of a job after
// its batch step) is put on a queue and answered at once, code OK with
// metadata queued=1, so slurmstepd ends the step without waiting for the
// bridge. One sender thread forwards the queue in order; an answer of
// UNAVAILABLE or DEADLINE_EXCEEDED (the bridge out of reach) is retried with
// backoff for up to kReleaseRetryFor after the release was queued (the
// step's credential ages: the bridge refuses one older than its
// slurm.credential_max_age), every other answer is final and logged. The
// release always comes after the step's tasks have ended (slurmstepd sends
// it from slurm_spank_exit), so a device is held a little longer than its
// step, never released earlier. At most kMaxQueuedReleases wait (the one
// being sent included);
// a release beyond that is forwarded on its connection's thread and answered
// with the bridge's answer (the step waits, as before: nothing is dropped).
// What is still queued when duet-node dies, or kStopDrain after Stop, is
// not sent: the
// bridge's job import (bridge/slurm/slurm_sync.h, step 3) releases a step's
// and a job's holdings once their Slurm job is no longer running, and a
// later Hold of those devices by another job releases them at once
// (bridge/slurm/stale_holders.h); while the job runs, Slurm has its devices
// anyway (job import records every running job).
//
#include <deque>
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
  static constexpr size_t kMaxQueuedReleases = 1024;
  static constexpr absl::Duration kReleaseRetryFor = absl::Minutes(5);
  // The first retry's pause; it doubles up to kRetryMaxPause.
  static constexpr absl::Duration kRetryFirstPause = absl::Milliseconds(50);
  static constexpr absl::Duration kRetryMaxPause = absl::Seconds(2);
  // After Stop, the queue's releases are still sent for this long (each once).
  static constexpr absl::Duration kStopDrain = absl::Seconds(3);

  // Binds `socket_path` (an old socket file there is replaced) and starts
  // accepting. Errors name the path.
  static absl::StatusOr<std::unique_ptr<StepAgent>> Start(const std::string& socket_path,
                                                          StepForwarder forward,
                                                          absl::Duration default_timeout);
  ~StepAgent();
  StepAgent(const StepAgent&) = delete;
  StepAgent& operator=(const StepAgent&) = delete;

  // Stops accepting, waits for the calls in flight, removes the socket, then
  // sends the queued releases for up to kStopDrain (once each, no retry) and
  // logs those left unsent. Idempotent.
  void Stop();

  // Releases queued and not yet answered by the bridge (the one being sent
  // included).
  size_t QueuedReleases() const;

 private:
  StepAgent(std::string socket_path, int fd, StepForwarder forward,
            absl::Duration default_timeout);
  void AcceptLoop();
  void Serve(int conn);
  // Moves a release onto the queue; false (and `call` untouched) when the
  // queue is full.
  bool Enqueue(StepCall* call);
  void SendLoop();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);

  const std::string socket_path_;
  const int listen_fd_;
  const StepForwarder forward_;
  const absl::Duration default_timeout_;
  std::thread accept_thread_;
  std::thread send_thread_;

  struct QueuedRelease {
    StepCall call;
    absl::Time queued_at;
  };
  mutable absl::Mutex queue_mu_;
  std::deque<QueuedRelease> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool sending_ ABSL_GUARDED_BY(queue_mu_) = false;  // SendLoop holds one
  // Set by Stop once no connection can queue more: SendLoop drains and ends.
  bool draining_ ABSL_GUARDED_BY(queue_mu_) = false;
  absl::Time drain_until_ ABSL_GUARDED_BY(queue_mu_);

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
