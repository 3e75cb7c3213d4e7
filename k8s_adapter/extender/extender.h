#pragma once

// The scheduler extender's decisions: filter, prioritize and bind over the
// ledger's live view. No HTTP here (server.h is the thin layer over it).
//
//  Filter     a pod that asks for GPUs/TPUs passes a node only when the
//             ledger knows the node and placement::Fits says the pod fits
//             now (ready, enough free devices of an accepted model, CPU and
//             memory). Nodes the ledger does not know, and nodes that are
//             cordoned, not ready or gone, are FailedAndUnresolvable
//             (preempting pods cannot help), and so are nodes Slurm will not
//             run work on (`unusable`: an admin's drain, down, not
//             responding), with Slurm's reason; nodes without room are
//             FailedNodes (preemption might). A pod that asks for no device
//             passes every node except ledger nodes that are not ready or
//             lack its CPU/memory. A pod that asks for TPUs and is no gang
//             member fails every host of a multi-host TPU slice
//             FailedAndUnresolvable (TPU_SLICE_WHOLE, docs/gangs.md 5).
//  Prioritize the configured placement policy's preference (Placement::raw:
//             packing counting Slurm and pods, fragmentation, model) for
//             each node where the pod fits, min-max scaled over the
//             request's nodes onto 0..kMaxExtenderPriority (the best node
//             10, the worst 0, rounded down). Placement's own 0..100 score
//             is too coarse for this: its packing tie-break is worth a
//             fraction of a point. 0 where the pod does not fit, and 0
//             everywhere for a pod that asks for no device (neutral).
//  Bind       GETs the pod (the binding args carry no resources) and acts
//             only for duet's own pods: the binding must name the pod's
//             uid, and its spec.schedulerName must be one of
//             scheduler_names (Options); anything else (another
//             scheduler's pod, an unknown pod, a replaced one) is refused
//             before anything is held or POSTed. It then holds its
//             devices through pods::PodHolds (the transaction PlacePod uses
//             too: a Slurm placeholder plus its ledger record when Slurm is
//             on, else a ledger holding with owner Pod on the devices
//             placement chooses), waits until the holding is durable, then
//             POSTs the Binding.
//             Any failure rolls the holding back and returns an error, so
//             kube-scheduler retries. A retry for a pod that already holds
//             on that node makes no second holding; a pod already bound to
//             that node is success.
//             Every call logs one line: who asked (`caller`),
//             the pod, its uid, the node, the devices and the result.
//  Gangs      with `gangs` and `gang_of` set (docs/gangs.md), a pod that
//             gang_of names as a gang member goes through the GangRegistry
//             instead: the filter reserves the gang on its first member and
//             fails every node FailedAndUnresolvable ("GANG_WAITING: k/N
//             members", GANG_NO_ROOM, GANG_MEMBER_MISMATCH, ...) until every
//             member has a slot; once complete it passes exactly the
//             member's slot's node. Prioritize gives that node 10, the rest
//             0. Bind refuses any other node, moves the slot's devices to the
//             member (GangRegistry::BindMember), waits until durable, POSTs
//             the Binding, and on failure gives the devices back to the slot.
//             Single pods are unchanged; a gang member's bind logs its
//             line as any other.
//
// CPU and memory: the ledger tracks devices only. `load` (Options) gives the
// CPU/memory already committed on a node (duet-bridge: what Slurm reports
// its jobs and placeholders hold, as of the last sync pass); without one the
// load is taken as zero, so the check is against the node's capacity only.
//
// Thread-safety: every method may be called concurrently (the ledger
// serialises holds, the GangRegistry gangs; the extender's only other
// mutable state is the domain usage cache and the pod request cache, both
// thread-safe).
//
// Domain packing (kDuet) reads a DomainUsage of the whole ledger. The first
// prioritize builds it; from then on a thread the extender owns rebuilds it
// every `domain_refresh` when the ledger changed, so no request pays the
// scan of every node (1 to 4 ms at 5,000 nodes).
//
// Prioritize scores from the extender's NodeTable (node_table.h): a row per
// ledger node with its fit data and domain packing inline, patched by the
// ledger's change listener before each change returns, so it is exact (a
// hold or release is seen by the next prioritize) while costing one lookup
// per name. Filter and bind read the ledger itself.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bridge/gang/gang.h"
#include "bridge/gang/registry.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/topology.h"
#include "bridge/pods/pod_holds.h"
#include "k8s_adapter/extender/node_table.h"
#include "k8s_adapter/extender/types.h"
#include "k8s_adapter/kube_api.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace extender {

// What bind needs of the Kubernetes API. Thread-safe.
class PodApi {
 public:
  virtual ~PodApi() = default;
  // The v1.Pod. NOT_FOUND when it does not exist.
  virtual absl::StatusOr<nlohmann::json> GetPod(const std::string& ns, const std::string& name) = 0;
  // POST the Binding (uid, when set, is a precondition). Errors as
  // k8s::BindPod (ABORTED: already bound or replaced).
  virtual absl::Status Bind(const std::string& ns, const std::string& name, const std::string& uid,
                            const std::string& node) = 0;
};

// The production PodApi over a KubeClient (not owned; must outlive it).
std::unique_ptr<PodApi> NewKubePodApi(k8s::KubeClient* client);

struct ExtenderOptions {
  placement::Policy policy = placement::Policy::kDuet;
  // Fragmentation target for kDuet/kFgd, read at each prioritize and bind
  // (duet-bridge: the workload it learns, placement::WorkloadModel); null:
  // each request's own shape.
  placement::WorkloadFn workload;
  // Told of every pod the filter reads (its key "pod/<uid>" and request), so
  // the learned workload counts the pods that arrive; null: none. Called
  // concurrently; must not block.
  std::function<void(const std::string& key, const placement::PodRequest&)> observe;
  // CPU/memory committed on a node; null: zero (see the class comment).
  // Prioritize calls it while reading its node table, which ledger changes
  // update: it must not call into the ledger.
  // duet-bridge passes what Slurm's jobs and placeholders hold
  // (SlurmNodeLoads, refreshed by every Slurm sync pass).
  std::function<placement::NodeLoad(const NodeView&)> load;
  // Why Slurm will not run work on a node now (drained, down, not
  // responding), empty when it will; null: never. duet-bridge passes
  // SlurmNodeLoads::Unusable (each sync pass). A pod's placeholder could not
  // be made there, so the filter drops such nodes as unresolvable.
  std::function<std::string(const std::string& node)> unusable;
  // Told of the CPU/memory a placeholder this extender made asked of Slurm,
  // so `load` counts it before the next sync pass reads it back. May be null.
  std::function<void(const std::string& node, const placement::NodeLoad&)> on_placeholder;
  // Blocks until ledger sequence `seq` is durable (Journal::WaitDurable);
  // null: nothing to wait for.
  std::function<absl::Status(uint64_t seq)> wait_durable;
  // Told of every refused bind (to post a Warning Event). May be null.
  std::function<void(const k8s::EventSpec&)> on_refusal;
  // Bind acts only for pods whose spec.schedulerName is one of these
  // (duet-bridge: extender.scheduler_names).
  std::vector<std::string> scheduler_names = {"duet"};
  // Gangs (see the class comment); both null: every pod is a single pod.
  // `gang_of` says which gang a pod is a member of (k8s_adapter/gang's
  // recognition), nullopt for a single pod, an error for a member whose
  // gang cannot be read (the filter fails every node with it). Its
  // GangSpec::member is replaced by the extender's own reading of the pod.
  // Called concurrently. `gangs` is not owned and must outlive the extender.
  std::function<absl::StatusOr<std::optional<gang::GangSpec>>(const nlohmann::json& pod)> gang_of;
  gang::GangRegistry* gangs = nullptr;
  // How often the domain usage is rebuilt in the background (when the
  // ledger changed since the last build); kDuet only.
  absl::Duration domain_refresh = absl::Seconds(1);
};

// Counters for tests and logs.
struct BindStats {
  uint64_t bound = 0;
  uint64_t refused = 0;
  uint64_t rolled_back = 0;
  uint64_t retries_idempotent = 0;
};

class Extender {
 public:
  // `ledger` and `api` are required; `placeholders` (the Slurm side of a
  // pod's hold: duet-bridge passes bridge/slurm's Placeholders) null when
  // Slurm is off. None is owned; all must outlive the extender.
  Extender(Ledger* ledger, pods::PlaceholderMaker* placeholders, PodApi* api, ExtenderOptions options);
  Extender(const Extender&) = delete;
  Extender& operator=(const Extender&) = delete;
  // Stops the domain usage refresher.
  ~Extender();

  // INVALID_ARGUMENT only for a pod whose resources cannot be read; the
  // caller turns that into a result (every node FailedAndUnresolvable).
  FilterResult Filter(const ExtenderArgs& args) const;
  // One entry per requested name, in order.
  std::vector<HostPriority> Prioritize(const ExtenderArgs& args) const;
  // Prioritize's scores alone, parallel to args.node_names: what the server
  // writes (PriorityListBody(names, scores)), without a copy of each name.
  std::vector<int64_t> PrioritizeScores(const ExtenderArgs& args) const;
  // The same for the pod's DOM, its text as sent (ExtenderArgs::pod_text;
  // "" when unknown) and names given as views (the server's
  // ParsePrioritizeArgsFast).
  std::vector<int64_t> PrioritizeScores(const nlohmann::json& pod, std::string_view pod_text,
                                        absl::Span<const std::string_view> names) const;
  // The same scores without the pod's DOM, when the extender can answer from
  // the pod's request alone (no gangs configured: gang_of reads the pod's
  // object) and has read this exact `pod_text` before (the filter of the
  // same pod keeps its request; see the pod request cache below). nullopt
  // otherwise: then parse the pod (ParsePodText) and call the above.
  std::optional<std::vector<int64_t>> PrioritizeScoresFromText(
      std::string_view pod_text, absl::Span<const std::string_view> names) const;
  // OK when the pod is bound to `args.node` with its devices held.
  // `caller` names who asked, for the log line (the server passes the
  // client certificate's subject and the peer address).
  absl::Status Bind(const BindingArgs& args, const std::string& caller = "");

  BindStats stats() const;
  // Reads of a pod's request answered by the pod request cache (tests).
  uint64_t pod_request_cache_hits() const { return request_hits_.load(); }

  // How many pod texts the request cache keeps (the most recent ones).
  static constexpr size_t kPodRequestCacheSize = 64;

 private:
  placement::NodeLoad LoadOf(const NodeView& view) const;
  // ParsePodRequest(pod), through the pod request cache when `pod_text` (the
  // pod's text, from which `pod` was parsed) is set.
  absl::StatusOr<placement::PodRequest> RequestOf(const nlohmann::json& pod,
                                                  std::string_view pod_text) const;
  // The cached request of exactly `pod_text`, if any.
  std::optional<absl::StatusOr<placement::PodRequest>> CachedRequest(std::string_view pod_text) const
      ABSL_LOCKS_EXCLUDED(requests_mu_);
  // Prioritize's scores for a single pod's request (count > 0).
  std::vector<int64_t> ScoreNames(const placement::PodRequest& req,
                                  absl::Span<const std::string_view> names) const;
  // Holds the pod's devices on `node` (PodHolds::Hold) and waits until the
  // holding is durable; a new holding that cannot be made durable is rolled
  // back.
  absl::Status Hold(const PodRef& pod, const placement::PodRequest& req, const std::string& node,
                    std::string* devices);
  // Undoes Hold. Errors are logged and returned for the message.
  absl::Status Rollback(const PodRef& pod, const std::string& node);
  absl::Status Refuse(const BindingArgs& args, const std::string& uid, absl::Status status);
  // Bind without its log line; `held` gets the devices the pod holds on
  // the node ("" for none).
  absl::Status BindAndHold(const BindingArgs& args, std::string* held);
  // The pod's gang when it is a gang member (gangs on); nullopt for a single
  // pod; an error when its gang cannot be read.
  absl::StatusOr<std::optional<gang::GangSpec>> GangOf(const nlohmann::json& pod) const;
  // Filter for a gang member.
  FilterResult FilterMember(const ExtenderArgs& args, gang::GangSpec spec,
                            const placement::PodRequest& req) const;
  // Bind's hold for a gang member: the slot's devices become the pod's;
  // waits until durable (a new move that cannot be made durable is undone).
  absl::Status HoldMember(const PodRef& pod, const std::string& node, std::string* devices);
  // The refresher thread's loop (see the class comment).
  void RefreshDomains() ABSL_LOCKS_EXCLUDED(refresh_mu_);

  Ledger* const ledger_;
  PodApi* const api_;
  const ExtenderOptions options_;
  pods::PodHolds holds_;
  // Prioritize's domain packing (kDuet), over every ledger node.
  mutable placement::DomainUsageCache domains_;
  // Prioritize's rows, one per ledger node (the domain packing of domains_'s
  // latest build inline).
  mutable NodeTable table_;
  // The pod request cache: ParsePodRequest's answer for the last
  // kPodRequestCacheSize pod texts read (filter and prioritize), keyed by the
  // text byte for byte, so a hit is what parsing that text again would give.
  // kube-scheduler sends the same pod's same bytes to /filter and then to
  // /prioritize, so prioritize reads its pod without a DOM. Model ids a hit
  // holds as 0 (no device had the model) are resolved again.
  struct CachedPodRequest {
    size_t hash = 0;
    std::string text;
    absl::StatusOr<placement::PodRequest> request;
  };
  mutable absl::Mutex requests_mu_;
  mutable std::vector<CachedPodRequest> requests_ ABSL_GUARDED_BY(requests_mu_);
  mutable size_t requests_next_ ABSL_GUARDED_BY(requests_mu_) = 0;  // the slot to replace
  mutable std::atomic<uint64_t> request_hits_{0};
  absl::Mutex refresh_mu_;
  bool stopping_ ABSL_GUARDED_BY(refresh_mu_) = false;
  std::thread refresher_;  // kDuet only

  std::atomic<uint64_t> bound_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> rolled_back_{0};
  std::atomic<uint64_t> retries_{0};
};

}  // namespace extender
}  // namespace duet
