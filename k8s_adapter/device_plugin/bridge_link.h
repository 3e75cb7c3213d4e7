#pragma once

// duet-node's link to duet-bridge: one gRPC channel (TLS or not, from the
// options), the ServiceAccount token on every call, the two unary calls
// Allocate makes (ListHoldings, PlacePod), and the WatchNodes stream for this
// node, reopened with backoff (100 ms -> 5 s) whenever it ends. What the
// calls' answers mean is the caller's business: no error is reworded here.
//
// Thread-safety: ListHoldings and PlacePod may be called from any thread at
// once (they block up to `bridge_timeout`). StartWatch runs one thread and
// is called once; `mu_` guards `stopping_` and the open stream's context so
// that Stop (idempotent, any thread but the watch's own) can end it.

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "k8s_adapter/device_plugin/node_options.h"
#include "k8s_adapter/device_plugin/step_agent.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace duet {
namespace node {

// Channel credentials for the bridge from the --bridge-ca/-cert/-key options:
// insecure when none is set. Errors name the flag of a file that cannot be
// read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> BridgeCredentials(
    const NodePluginOptions& options);

class BridgeLink {
 public:
  // Called on the watch thread with this node's latest state, or nullptr
  // when the node left the ledger. Not called for RESYNC markers.
  using NodeCallback = std::function<void(const v1::Node* node)>;

  // `watch_restarts` and `watch_connected` (not owned) are the stream's
  // metrics. Connects lazily: no call is made until one is asked for.
  BridgeLink(const NodePluginOptions& options,
             std::shared_ptr<grpc::ChannelCredentials> credentials,
             prometheus::Counter* watch_restarts, prometheus::Gauge* watch_connected);
  ~BridgeLink();
  BridgeLink(const BridgeLink&) = delete;
  BridgeLink& operator=(const BridgeLink&) = delete;

  // The ledger's holdings on this node, asked now (not the watch's view).
  grpc::Status ListHoldings(std::vector<v1::Holding>* holdings) const;
  // A placeholder for a pod that bypassed the duet scheduler (may wait for
  // Slurm up to `bridge_timeout`).
  grpc::Status PlacePod(const v1::PlacePodRequest& request, v1::Holding* placed) const;
  // A Slurm step's Hold or Release for the step agent (step_agent.h): the
  // step's credential as the metadata it names, the call's own timeout.
  grpc::Status ForwardStep(const StepCall& call) const;

  // Starts the watch thread; `on_node` runs on it for every node event.
  void StartWatch(NodeCallback on_node);
  // Ends the stream and joins the watch thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void WatchLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the bridge token (bridge_token_file) to a call to the bridge.
  void AddBridgeToken(grpc::ClientContext* ctx) const;

  const NodePluginOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
  prometheus::Counter* const watch_restarts_;
  prometheus::Gauge* const watch_connected_;
  NodeCallback on_node_;  // set before the watch thread starts

  absl::Mutex mu_;
  // Signalled by Stop: ends the wait between two streams.
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread watch_thread_;
};

}  // namespace node
}  // namespace duet
