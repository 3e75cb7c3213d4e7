#pragma once

// DraMode: the DRA lending mode's wiring in duet-bridge (docs/dra.md), made
// by Bridge::Start when dra.enabled. It owns
//  - the DeviceMap, rebuilt from a ResourceSlice informer and the ledger's
//    nodes of the lending pools;
//  - the DeviceTaintRules writer (the rule API detected, or dra.kube_version),
//    with its watch of duet's rules (a cache: no periodic LIST);
//  - the quorum ResourceClaim reads reclaims and claim releases check
//    (QuorumClaimLister);
//  - the Lender (bridge/dra), with the placeholders as its LendMaker;
//  - a ResourceClaim informer: a claim deleted, or seen without an
//    allocation while the ledger records one for it, and, after each
//    complete list and every 30 s, every claim the ledger holds that the
//    informer's view does not allocate (an admission whose write never
//    landed) starts Lender::ReleaseClaimIfDeallocated, the fenced release
//    (its quorum read decides; the informer only says when to look);
//  - a pending-pod informer: a pod kube-scheduler marked Unschedulable that
//    asks for devices of a lent driver (claims' ExactCount requests, or an
//    extended resource a DeviceClass serves) makes duet lend that many on
//    the node placement picks among the lending nodes (LendDemand). The
//    picks are made one at a time on the loop thread, each counting the
//    devices promised to the lends under way as taken; the lends run on a
//    thread each, up to 4 at once, and the loop goes on meanwhile (a pod
//    whose lend is under way is not served again);
//  - a loop thread: map rebuilds (the nodes whose mapping changed are marked
//    dirty for the rules), demand, Lender::ReconcileRules each pass (200 ms,
//    and at once when the pod informer sees a pod newly pending for devices,
//    so a lend does not wait for the next pass: only the dirty nodes' rules,
//    or a full reconcile after a relist of the rules' watch) and
//    Lender::Resync every dra::kFullRuleResync; a
//    thread for the claim releases (each waits out the claim's admission
//    grace); and a thread for Lender::Tick every second (a reclaim waits out
//    the admission grace there);
//  - the admission webhook (k8s_adapter/dra), started only after the first
//    map is built, so it never answers from an empty map;
//  - gangs (docs/dra.md, "Gangs"), when `gangs.maker` is set: the lending
//    mode's own BridgeGangs (a GangRegistry over the lending pools' nodes,
//    recovered from the ledger before the webhook starts, ticked on its own
//    thread) and dra::GangLends, the fence the Lender asks about a gang
//    slot's devices. A pending pod that `gang_of` recognises as a gang
//    member asking GPUs of a lent driver, or TPUs of a multi-host slice its
//    node selector names (every host of one free slice pool, every chip:
//    dra::TpuGangMember), lends for the whole gang (one Slurm job, or
//    nothing and DuetGangUnplaceable), never a single lend. A single pod
//    asking TPUs is never lent a host of a multi-host slice
//    (dra::SingleTpuLendRefusal; DuetLendRefused on the pod when nothing
//    is lent).
//    Such pods are served when kube-scheduler marked them Unschedulable, or
//    when its PodScheduled condition is False for another reason (a
//    member whose allocation the webhook refused, GANG_WAITING).
//
// Thread-safety: Start/Stop from one owner thread; the rest is internal.

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bridge/config/config.h"
#include "bridge/dra/dra_device.h"
#include "bridge/dra/lend_maker.h"
#include "bridge/dra/gang_lends.h"
#include "bridge/dra/lender.h"
#include "bridge/gang/gang.h"
#include "bridge/server/gangs.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/placement.h"
#include "common/clock.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"

namespace duet {
namespace k8s {
class Informer;
class EventRecorder;
}  // namespace k8s
namespace k8s_dra {
class DeviceMap;
class TaintRules;
class WebhookServer;
struct DeviceDemand;
}  // namespace k8s_dra

// Quorum reads of ResourceClaims (no resourceVersion: served from etcd): the
// LIST, paged, and the GET of one claim. Admin-access results are left out.
// Thread-safe.
class QuorumClaimLister final : public dra::ClaimLister {
 public:
  // `api`: the group version's path, e.g. "/apis/resource.k8s.io/v1". Not
  // owned.
  QuorumClaimLister(k8s::KubeClient* kube, std::string api);
  absl::StatusOr<std::vector<dra::AllocatedClaim>> ListAllocated() override;
  // 404, or a claim of that name with another uid: nullopt.
  absl::StatusOr<std::optional<dra::AllocatedClaim>> GetClaim(
      const dra::ClaimRef& claim) override;

 private:
  k8s::KubeClient* const kube_;
  const std::string api_;
};

// A claim's allocated devices (status.allocation.devices.results, admin
// access left out); empty when it has no allocation.
std::vector<dra::DraDevice> AllocatedDevices(const nlohmann::json& claim);

struct DraModeDeps {
  const DraConfig* config = nullptr;
  Ledger* ledger = nullptr;
  k8s::KubeClient* kube = nullptr;
  dra::LendMaker* lends = nullptr;
  dra::Lender::DurableWait durable;
  const Clock* clock = Clock::Real();
  prometheus::Registry* registry = nullptr;  // may be null
  // Where DuetLendRefused Events go (a node that cannot lend); may be null.
  k8s::EventRecorder* events = nullptr;
  // How lending picks a node for a pending pod.
  placement::Policy policy = placement::Policy::kDuet;
  // Gangs: the lending mode's BridgeGangs is started from these (its
  // node_filter, in_use and ledger are DraMode's) when `gangs.maker` and
  // `gang_of` are set; else gang members are lent for one by one.
  BridgeGangsDeps gangs;
  std::function<absl::StatusOr<std::optional<gang::GangSpec>>(const nlohmann::json& pod)> gang_of;
};

class DraMode {
 public:
  // Detects the rule API, starts the informers (their first lists must
  // succeed), builds the first map, resyncs the rules, starts the webhook
  // and the loop. Errors name the step (dra.kube_version, the discovery,
  // dra.webhook.listen / tls).
  static absl::StatusOr<std::unique_ptr<DraMode>> Start(DraModeDeps deps);
  ~DraMode();
  DraMode(const DraMode&) = delete;
  DraMode& operator=(const DraMode&) = delete;

  // Idempotent: the webhook first (kube-apiserver then fails closed), then
  // the loop and the informers. Waits for a reclaim or claim release under
  // way (at most about dra.webhook.admission_grace).
  void Stop();

  int webhook_port() const;
  const std::string& rule_api() const { return rule_api_; }
  dra::Lender* lender() { return lender_.get(); }
  // The lending mode's gangs (null when gangs are off).
  gang::GangRegistry* gang_registry() {
    return gang_registry_ ? gang_registry_->registry() : nullptr;
  }

 private:
  class SliceHandler;
  class ClaimHandler;
  class PodHandler;
  class InventoryListener;

  explicit DraMode(DraModeDeps deps);
  absl::Status Init();
  void Loop();
  // Lender::Tick every second (warm buffer, idle reclaims).
  void TickLoop();
  // Rebuilds the map from the slices and the ledger's lending nodes when
  // either changed (the ledger is read only with `read_inventory` or `force`:
  // the loop passes it when the ledger told InventoryListener of a node
  // added, changed or removed, so a quiet inventory costs no walk).
  void RebuildMap(bool force, bool read_inventory);
  // One lend LendDemand decided: `count` devices of `kind` on `node` for
  // the pod of uid `pod_uid` (`pod`: ns/name, for the log).
  struct DemandLend {
    std::string pod_uid;
    std::string pod;
    std::string node;
    DeviceKind kind = DeviceKind::kGpu;
    uint32_t count = 0;
  };
  // Lends for the pending pods that ask for devices: picks a node for each
  // (under lend_mu_) and starts its lend (RunLend, on a thread of its own),
  // waiting while kDemandLendsInFlight are under way.
  void LendDemand();
  // Lender::Lend, then takes back the lend's promise.
  void RunLend(const DemandLend& l) ABSL_LOCKS_EXCLUDED(lend_mu_);
  // Forgets the lend threads that are done; `all`: waits for every one.
  void ReapLends(bool all);
  // Starts the fenced release of the claims deleted, seen deallocated, or
  // (sweep) held but not allocated in the informer's view.
  void ReleaseClaims();
  // ReleaseClaims every 200 ms (a release waits out its claim's grace).
  void ReleaseLoop();
  // The lending pool of a ledger node ("" when none).
  std::string PoolOf(const std::string& node) const;
  // A pending pod of a gang (gangs on): lends for the whole gang through
  // GangLends. False when the pod is lent for alone: no gang member, or a
  // gang asking whole GPU hosts, TPUs and GPUs, or TPUs of no slice.
  bool LendForGang(const nlohmann::json& pod,
                   const std::map<std::string, k8s_dra::DeviceDemand>& demand);

  DraModeDeps deps_;
  std::string rule_api_;
  std::unique_ptr<k8s_dra::DeviceMap> map_;
  std::unique_ptr<k8s_dra::TaintRules> rules_;
  std::unique_ptr<QuorumClaimLister> claims_;
  std::unique_ptr<BridgeGangs> gang_registry_;  // gangs: before the Lender that asks it
  std::unique_ptr<dra::GangLends> gangs_;
  std::unique_ptr<dra::Lender> lender_;
  std::unique_ptr<SliceHandler> slice_handler_;
  std::unique_ptr<ClaimHandler> claim_handler_;
  std::unique_ptr<PodHandler> pod_handler_;
  std::unique_ptr<InventoryListener> inventory_listener_;
  std::unique_ptr<k8s::Informer> slice_informer_;
  std::unique_ptr<k8s::Informer> claim_informer_;
  std::unique_ptr<k8s::Informer> pod_informer_;
  std::unique_ptr<k8s_dra::WebhookServer> webhook_;
  // Loop thread only: the lending inventory's fingerprint at the last
  // rebuild and when each pending pod was last served; release thread only:
  // the last claim sweep.
  uint64_t map_ledger_seq_ = 0;
  absl::Time last_sweep_ = absl::InfinitePast();
  std::map<std::string, absl::Time> served_;
  // The lending nodes that cannot lend, with the reason last said.
  std::map<std::string, std::string> refused_;

  // LendDemand's lends under way: how many, the devices promised to them
  // per node and kind (released once the lend is done: the ledger holds
  // what it lent), and the pods they serve (uid -> lends). Lock order:
  // lend_mu_, then the ledger's.
  absl::Mutex lend_mu_;
  int lends_in_flight_ ABSL_GUARDED_BY(lend_mu_) = 0;
  std::map<std::string, std::map<DeviceKind, uint32_t>> promised_ ABSL_GUARDED_BY(lend_mu_);
  std::map<std::string, int> lending_pods_ ABSL_GUARDED_BY(lend_mu_);
  // The lend threads (loop thread only; Stop after the loop ended).
  std::vector<std::future<void>> lends_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A pod became pending for devices since the loop's last pass.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;
  std::thread release_;
  std::thread tick_;
};

}  // namespace duet
