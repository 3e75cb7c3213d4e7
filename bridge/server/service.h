#pragma once

// The duet.v1.Ledger gRPC service: a thin boundary that turns protos into
// ledger calls and Status into gRPC codes. Mutations answer only once their
// change is durable (Durability). Node changes reach WatchNodes streams
// through the WatchHub (watch_hub.h), a ledger ChangeListener.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/workload_model.h"
#include "bridge/pods/pod_holds.h"
#include "bridge/server/audit.h"
#include "bridge/server/durability.h"
#include "bridge/server/metrics.h"
#include "bridge/server/watch_hub.h"
#include "common/credential/munge_payload.h"
#include "duet/v1/duet.grpc.pb.h"

namespace duet {

// What a caller sent to prove it is slurmstepd of a Slurm owner (gRPC
// metadata x-duet-munge and x-duet-slurm-key-cred; "" when absent).
struct SlurmCallerCredentials {
  std::string munge;
  std::string slurm_key;
};

// Every call is served with gRPC's async API on threads of the service's own.
// With the gRPC this builds against (Debian's 1.51), callback-API calls are
// run by two threads that wait for work up to 1 s at a time and, after a wait
// that found none, sleep 100 ms: a call that arrives after a quiet spell of a
// second or more can wait up to 100 ms before it is run (bench/slurm/
// RESULTS.md, "The agent path's tail"; bench/grpc/RESULTS.md, "After a quiet
// spell"). A thread blocked on a completion queue of its own never sleeps.
using LedgerServiceBase = v1::Ledger::WithAsyncMethod_ListNodes<
    v1::Ledger::WithAsyncMethod_GetNode<v1::Ledger::WithAsyncMethod_Hold<
        v1::Ledger::WithAsyncMethod_Release<v1::Ledger::WithAsyncMethod_ListHoldings<
            v1::Ledger::WithAsyncMethod_WatchNodes<v1::Ledger::WithAsyncMethod_PlacePod<
                v1::Ledger::WithAsyncMethod_GetWorkload<v1::Ledger::Service>>>>>>>>;

class LedgerService final : public LedgerServiceBase {
 public:
  struct Options {
    // WatchNodes streams open at once, in all.
    int max_watch_streams = 256;
    // ... and from one caller (WatchCaller: its peer address), so that one
    // peer, authenticated or not, cannot take every slot from duet-node.
    // Refusals carry TOO_MANY_WATCHES. 0 or less: no per-caller limit (all
    // callers behind one NAT share an address).
    int max_watch_streams_per_caller = 16;
    // Events queued per watch stream before it is told to resync.
    size_t max_watch_queue = 4096;
    // Set: Hold and Release for a Slurm owner (slurm_job, slurm_step) must
    // pass it first. Arguments: the call's credentials, what they must bind
    // (slurm_munge::BindingOf the request: method, node, owner, request
    // digest), and where to put the caller's identity for the audit log. A
    // refusal is answered as is (and counted as a refused Hold); nothing in
    // the ledger changes.
    std::function<absl::Status(const SlurmCallerCredentials& credentials,
                               const slurm_munge::Binding& want, std::string* who)>
        authorize_slurm_owner;
    // auth.mode token (bridge/auth/authz.h). Set: Hold and Release for a pod
    // or placeholder owner, and PlacePod,
    // must pass it first. Arguments: the call's context, the method, the
    // request's node and owner, and where to put the caller's identity for
    // the audit log. A refusal is answered as is; nothing in the ledger
    // changes.
    std::function<absl::Status(const grpc::ServerContextBase& ctx, const char* method,
                               const std::string& node, const Owner& owner, std::string* who)>
        authorize_call;
    // Set: every successful Hold, Release and PlacePod is recorded here once
    // durable, with the identity the check that applied proved
    // ("unauthenticated(PEER)" where none applied). Not owned.
    AuditLog* audit = nullptr;
    // PlacePod holds through pods::PodHolds, as the extender's bind does.
    // The Slurm side (duet-bridge: bridge/slurm's Placeholders); null when
    // Slurm is off (PlacePod then holds devices in the ledger as owner Pod).
    // Not owned.
    pods::PlaceholderMaker* placeholders = nullptr;
    // Policy, CPU/memory load and placeholder feedback (the same as the
    // extender's; see PodHoldsOptions).
    pods::PodHoldsOptions pod_holds;
    // A Hold for a Slurm owner refused with RESOURCE_EXHAUSTED (a device is
    // held) is tried once more when this returns true: it has released
    // holdings that Slurm says are stale (StaleHolders::ReleaseEnded). Null:
    // no second try.
    std::function<bool(const HoldRequest& request)> resolve_slurm_conflict;
    // slurm.preemption: evict-pods. A Hold for a Slurm owner refused with
    // RESOURCE_EXHAUSTED is answered with what this returns instead, when
    // it returns something: the POD_EVICTING refusal, while every pod on the
    // devices is being evicted for the Slurm preemption that gave them to
    // this job. Asked first with `ask_slurm` false (evictions under way only,
    // so a waiting step's retries cost no Slurm call), then, after
    // resolve_slurm_conflict, with true. Null or nullopt: the refusal as is.
    std::function<std::optional<absl::Status>(const HoldRequest& request, bool ask_slurm)>
        pod_eviction_wait;
    // Slurm's state and reason of a node for ListNodes/GetNode answers
    // (Node.slurm_state/slurm_reason); null when Slurm is off.
    std::function<std::pair<std::string, std::string>(const std::string& node)> slurm_state;
    // GetWorkload's answer (duet-bridge: its WorkloadModel); null: the
    // service answers UNIMPLEMENTED.
    const placement::WorkloadModel* workload = nullptr;
  };
  // All pointers must outlive the service. `metrics` may be null.
  LedgerService(Ledger* ledger, Durability* durability, WatchHub* hub, Metrics* metrics,
                Options options);

  ~LedgerService();

  // Adds the service, and the completion queues its threads use, to
  // `builder`. Then, once the server is built, StartCallThreads; and after
  // the server's Shutdown, once the Durability has answered every change
  // still waiting and before the server is destroyed (its last events still
  // name it), StopCallThreads. Until StartCallThreads, calls wait.
  void RegisterWith(grpc::ServerBuilder* builder);
  // `threads` serve every call but PlacePod; PlacePod, which may wait for
  // slurmctld (up to slurm.call_timeout), has `place_threads` of its own, so
  // that pods placed at kubelet's admission never hold up a step's Hold.
  void StartCallThreads(int threads = 4, int place_threads = 2);
  void StopCallThreads();

  // While not serving (journal failed, shutting down) mutations are refused
  // with UNAVAILABLE; reads go on.
  void SetServing(bool serving) { serving_.store(serving); }
  bool serving() const { return serving_.load(); }

 private:
  // One WatchNodes stream.
  class WatchCall;
  // ToProto plus Slurm's view of the node (Options::slurm_state).
  void NodeToProto(const NodeView& view, v1::Node* out) const;
  // The side of the live owners that hold devices `request` names on its
  // node (pod if any is a pod's), nullopt when none does (a Hold of "any N"
  // that found no room, or the holder left since).
  std::optional<HolderClass> BlockingClass(const HoldRequest& request) const;
  // Options::authorize_slurm_owner for a Slurm owner (`binding` is then
  // what its credential must bind), with the call's credentials;
  // Options::authorize_call for a pod or placeholder owner. OK where the one
  // that applies is not set. `who` gets the caller's identity.
  absl::Status AuthorizeCall(const grpc::ServerContextBase& ctx, const char* method,
                             const std::string& node, const Owner& owner,
                             const std::optional<slurm_munge::Binding>& binding,
                             std::string* who) const;
  // Options::audit, if set.
  void Audit(const char* method, const std::string& who, const std::string& node,
             const Owner& owner, const std::vector<HeldDevice>& devices, bool changed) const;
  // A WatchNodes slot for `caller` under both limits; TOO_MANY_WATCHES when
  // none is left. Every slot taken is given back by ReleaseWatchSlot.
  absl::Status TakeWatchSlot(const std::string& caller);
  void ReleaseWatchSlot(const std::string& caller);
  // What the completion queues' tags point to.
  class CallTag;
  // One async unary call, from its request to its answer.
  template <class Request, class Response>
  class UnaryCallOf;
  // A unary call being handled: when it started, its method (for metrics)
  // and what sends its answer (from whichever thread has it).
  struct UnaryCall {
    absl::Time start;
    const char* method;
    std::function<void(const grpc::Status&)> finish;
  };
  // The bodies of the unary calls; each answers through `call`, once.
  void ListNodesCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                     const v1::ListNodesRequest* req, v1::ListNodesResponse* resp);
  void GetNodeCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                   const v1::GetNodeRequest* req, v1::Node* resp);
  void HoldCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                const v1::HoldRequest* req, v1::HoldResponse* resp);
  void ReleaseCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                   const v1::ReleaseRequest* req, v1::ReleaseResponse* resp);
  void ListHoldingsCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                        const v1::ListHoldingsRequest* req, v1::ListHoldingsResponse* resp);
  // With Slurm it waits for slurmctld (bounded by slurm.call_timeout), on a
  // PlacePod thread; it is called only for pods that bypassed the duet
  // scheduler, so it is rare.
  void PlacePodCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                    const v1::PlacePodRequest* req, v1::Holding* resp);
  void GetWorkloadCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                       const v1::GetWorkloadRequest* req, v1::WorkloadResponse* resp);
  // Asks for the first call of every method (each call, once it arrives,
  // asks for the next).
  void AskAll();
  // Finishes the call with `status`, recording latency and code.
  void Answer(const UnaryCall& call, const absl::Status& status);
  // Answer for a refused grant (Hold, PlacePod), counted by its code.
  void Refuse(const UnaryCall& call, const absl::Status& status);

  // Answers once change `seq` is durable, running `on_durable` first; if the
  // journal failed, answers UNAVAILABLE and stops serving mutations.
  void AnswerWhenDurable(const UnaryCall& call, uint64_t seq, std::function<void()> on_durable);

  Ledger* const ledger_;
  Durability* const durability_;
  WatchHub* const hub_;
  Metrics* const metrics_;
  const Options options_;
  pods::PodHolds pod_holds_;
  std::atomic<bool> serving_{true};
  // A completion queue and the threads blocked on it.
  struct CallQueue {
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    std::vector<std::thread> threads;
  };
  CallQueue calls_;  // every call but PlacePod
  CallQueue place_;  // PlacePod
  absl::Mutex calls_mu_;
  bool calls_stopping_ ABSL_GUARDED_BY(calls_mu_) = false;
  bool calls_started_ ABSL_GUARDED_BY(calls_mu_) = false;
  absl::Mutex watch_mu_;
  int watch_streams_ ABSL_GUARDED_BY(watch_mu_) = 0;
  // Open streams per caller; a caller leaves the map with its last stream.
  std::map<std::string, int> watch_streams_by_caller_ ABSL_GUARDED_BY(watch_mu_);
};

}  // namespace duet
