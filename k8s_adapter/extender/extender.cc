#include "k8s_adapter/extender/extender.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "bridge/placement/prepared.h"
#include "bridge/placement/tpu_slice.h"
#include "common/device/device.h"
#include "k8s_adapter/common/pod_request.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace extender {
namespace {

class KubePodApi final : public PodApi {
 public:
  explicit KubePodApi(k8s::KubeClient* client) : client_(client) {}

  absl::StatusOr<nlohmann::json> GetPod(const std::string& ns, const std::string& name) override {
    absl::StatusOr<std::string> body =
        client_->Get(absl::StrCat("/api/v1/namespaces/", ns, "/pods/", name));
    if (!body.ok()) return body.status();
    nlohmann::json pod = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (pod.is_discarded() || !pod.is_object()) {
      return absl::InternalError(absl::StrCat("pod ", ns, "/", name, ": the API server's reply is not JSON"));
    }
    return pod;
  }

  absl::Status Bind(const std::string& ns, const std::string& name, const std::string& uid,
                    const std::string& node) override {
    return k8s::BindPod(*client_, ns, name, uid, node);
  }

 private:
  k8s::KubeClient* const client_;
};

bool Unresolvable(NodeState s) { return s != NodeState::kReady; }

// Placement's reasons start "node NAME: "; FailedNodes is keyed by node
// already, and kube-scheduler counts nodes per distinct message in the pod's
// FailedScheduling event ("3 duet: 2 of 8 gpu devices ..."), so the name
// would only split the counts.
std::string Reason(absl::string_view reason, const std::string& node) {
  absl::string_view r = reason;
  if (absl::ConsumePrefix(&r, "node ") && absl::ConsumePrefix(&r, node) && absl::ConsumePrefix(&r, ": ")) {
    return absl::StrCat("duet: ", r);
  }
  return absl::StrCat("duet: ", reason);
}

// "gpu0,gpu3" or "gpu2:500m" (a share): the log's devices.
std::string DevicesText(const std::vector<HeldDevice>& devices) {
  std::string out;
  for (const HeldDevice& d : devices) {
    if (!out.empty()) out.push_back(',');
    absl::StrAppend(&out, DeviceKindName(d.kind), d.index);
    if (d.milli != kWholeDevice) absl::StrAppend(&out, ":", d.milli, "m");
  }
  return out;
}

}  // namespace

std::unique_ptr<PodApi> NewKubePodApi(k8s::KubeClient* client) {
  return std::make_unique<KubePodApi>(client);
}

Extender::Extender(Ledger* ledger, pods::PlaceholderMaker* placeholders, PodApi* api,
                   ExtenderOptions options)
    : ledger_(ledger),
      api_(api),
      options_(std::move(options)),
      holds_(ledger, placeholders,
             pods::PodHoldsOptions{options_.policy, options_.workload, options_.load,
                                   options_.on_placeholder}),
      table_(ledger) {
  if (options_.policy == placement::Policy::kDuet) {
    refresher_ = std::thread([this] { RefreshDomains(); });
  }
}

Extender::~Extender() {
  {
    absl::MutexLock l(&refresh_mu_);
    stopping_ = true;
  }
  if (refresher_.joinable()) refresher_.join();
}

void Extender::RefreshDomains() {
  // The ledger sequence the last build saw; 0: not known (the first
  // request's build), so the first round rebuilds.
  uint64_t built_seq = 0;
  while (true) {
    {
      absl::MutexLock l(&refresh_mu_);
      refresh_mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.domain_refresh);
      if (stopping_) return;
    }
    // Nothing before the first prioritize builds one; nothing to redo while
    // the ledger has not changed.
    if (domains_.Current() == nullptr || ledger_->seq() == built_seq) continue;
    LedgerSnapshot snap = ledger_->Snapshot();
    built_seq = snap.seq;
    table_.SetDomains(domains_.Refresh(absl::Now(), [&snap] { return std::move(snap.nodes); }));
  }
}

placement::NodeLoad Extender::LoadOf(const NodeView& view) const { return holds_.LoadOf(view); }

FilterResult Extender::Filter(const ExtenderArgs& args) const {
  FilterResult out;
  absl::StatusOr<placement::PodRequest> req = RequestOf(args.pod, args.pod_text);
  if (!req.ok()) {
    const std::string msg = absl::StrCat("duet: ", req.status().message());
    for (const std::string& n : args.node_names) out.failed_unresolvable[n] = msg;
    return out;
  }
  if (options_.observe) {
    const nlohmann::json* md = k8s::Field(args.pod, "metadata");
    const nlohmann::json* uid = md == nullptr ? nullptr : k8s::Field(*md, "uid");
    if (uid != nullptr && uid->is_string() && !uid->get_ref<const std::string&>().empty()) {
      options_.observe(absl::StrCat("pod/", uid->get_ref<const std::string&>()), *req);
    }
  }
  absl::StatusOr<std::optional<gang::GangSpec>> spec = GangOf(args.pod);
  if (!spec.ok()) {
    const std::string msg = absl::StrCat("duet: ", spec.status().message());
    for (const std::string& n : args.node_names) out.failed_unresolvable[n] = msg;
    return out;
  }
  if (spec->has_value()) return FilterMember(args, **std::move(spec), *req);
  out.node_names.reserve(args.node_names.size());
  std::string reason;
  const std::vector<std::shared_ptr<const NodeView>> views = ledger_->GetNodes(args.node_names);
  for (size_t i = 0; i < views.size(); ++i) {
    const std::string& name = args.node_names[i];
    const NodeView* view = views[i].get();
    if (view == nullptr) {
      if (req->count == 0) {
        out.node_names.push_back(name);  // not a shared node: not duet's concern
      } else {
        out.failed_unresolvable[name] = "duet: not a shared GPU/TPU node (not in duet's ledger)";
      }
      continue;
    }
    if (Unresolvable(view->spec.state)) {
      out.failed_unresolvable[name] = absl::StrCat("duet: node is ", NodeStateName(view->spec.state));
      continue;
    }
    if (options_.unusable && req->count > 0) {
      std::string why = options_.unusable(name);
      if (!why.empty()) {
        out.failed_unresolvable[name] = absl::StrCat("duet: node is ", why);
        continue;
      }
    }
    if (req->kind == DeviceKind::kTpu && req->count > 0) {
      // A multi-host TPU slice is taken whole (docs/gangs.md 5).
      if (std::optional<placement::TpuSliceHost> slice = placement::TpuSliceOf(*view)) {
        out.failed_unresolvable[name] = absl::StrCat("duet: ", placement::SliceRefusal(name, *slice));
        continue;
      }
    }
    // Beside the placeholders binds have asked of Slurm and not yet got.
    if (holds_.Fits(*view, *req, &reason)) {
      out.node_names.push_back(name);
    } else {
      out.failed[name] = Reason(reason, name);
    }
  }
  return out;
}

absl::StatusOr<std::optional<gang::GangSpec>> Extender::GangOf(const nlohmann::json& pod) const {
  if (options_.gangs == nullptr || !options_.gang_of) return std::optional<gang::GangSpec>();
  return options_.gang_of(pod);
}

FilterResult Extender::FilterMember(const ExtenderArgs& args, gang::GangSpec spec,
                                    const placement::PodRequest& req) const {
  FilterResult out;
  spec.member = req;
  const PodRef pod = PodRefOf(args.pod);
  std::string refusal;
  if (pod.uid.empty()) {
    refusal = "duet: a gang member needs metadata.uid";
  } else if (req.count == 0) {
    refusal = absl::StrCat("duet: GANG_MEMBER_MISMATCH: gang ", spec.key.ToString(),
                           ": a member that asks no device cannot hold a slot");
  }
  gang::Admission a;
  if (refusal.empty()) {
    a = options_.gangs->Admit(spec, gang::MemberRef{pod.uid, pod.ns, pod.name});
    if (a.kind != gang::Admission::kReady) refusal = absl::StrCat("duet: ", a.reason);
  }
  for (const std::string& name : args.node_names) {
    if (!refusal.empty()) {
      out.failed_unresolvable[name] = refusal;
    } else if (name == a.node) {
      out.node_names.push_back(name);
    } else {
      // All or nothing: the member goes to its slot's node or nowhere.
      out.failed_unresolvable[name] = absl::StrCat(
          "duet: GANG_NODE: this member's slot of gang ", spec.key.ToString(), " is on node ", a.node);
    }
  }
  return out;
}

std::vector<HostPriority> Extender::Prioritize(const ExtenderArgs& args) const {
  const std::vector<int64_t> scores = PrioritizeScores(args);
  std::vector<HostPriority> out;
  out.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) out.push_back({args.node_names[i], scores[i]});
  return out;
}

std::vector<int64_t> Extender::PrioritizeScores(const ExtenderArgs& args) const {
  const std::vector<std::string_view> names(args.node_names.begin(), args.node_names.end());
  return PrioritizeScores(args.pod, args.pod_text, names);
}

std::vector<int64_t> Extender::PrioritizeScores(const nlohmann::json& pod, std::string_view pod_text,
                                                absl::Span<const std::string_view> names) const {
  if (absl::StatusOr<std::optional<gang::GangSpec>> spec = GangOf(pod);
      !spec.ok() || spec->has_value()) {
    std::vector<int64_t> out(names.size(), 0);
    // A gang member: its slot's node, nothing else.
    const std::optional<std::string> node =
        spec.ok() ? options_.gangs->NodeOf(PodRefOf(pod).uid) : std::nullopt;
    for (size_t i = 0; i < out.size(); ++i) {
      if (node.has_value() && names[i] == *node) out[i] = kMaxExtenderPriority;
    }
    return out;
  }
  absl::StatusOr<placement::PodRequest> req = RequestOf(pod, pod_text);
  if (!req.ok() || req->count == 0) return std::vector<int64_t>(names.size(), 0);
  return ScoreNames(*req, names);
}

std::optional<std::vector<int64_t>> Extender::PrioritizeScoresFromText(
    std::string_view pod_text, absl::Span<const std::string_view> names) const {
  // GangOf reads the pod's object whenever gangs are configured.
  if (options_.gangs != nullptr && options_.gang_of) return std::nullopt;
  std::optional<absl::StatusOr<placement::PodRequest>> req = CachedRequest(pod_text);
  if (!req.has_value()) return std::nullopt;
  if (!req->ok() || (*req)->count == 0) return std::vector<int64_t>(names.size(), 0);
  return ScoreNames(**req, names);
}

std::optional<absl::StatusOr<placement::PodRequest>> Extender::CachedRequest(
    std::string_view pod_text) const {
  if (pod_text.empty()) return std::nullopt;
  const size_t hash = absl::HashOf(pod_text);
  std::optional<absl::StatusOr<placement::PodRequest>> out;
  {
    absl::MutexLock l(&requests_mu_);
    for (const CachedPodRequest& c : requests_) {
      if (c.hash == hash && c.text == pod_text) {
        out = c.request;
        break;
      }
    }
  }
  if (!out.has_value()) return std::nullopt;
  request_hits_.fetch_add(1, std::memory_order_relaxed);
  if (out->ok()) {
    // An id of 0 was a model no ledger device had when the text was read; one
    // may have one now (ParsePodRequest would resolve it).
    placement::PodRequest& r = **out;
    if (std::find(r.model_ids.begin(), r.model_ids.end(), 0u) != r.model_ids.end()) r.ResolveModelIds();
  }
  return out;
}

absl::StatusOr<placement::PodRequest> Extender::RequestOf(const nlohmann::json& pod,
                                                          std::string_view pod_text) const {
  if (std::optional<absl::StatusOr<placement::PodRequest>> cached = CachedRequest(pod_text)) {
    return *std::move(cached);
  }
  absl::StatusOr<placement::PodRequest> req = ParsePodRequest(pod);
  if (!pod_text.empty()) {
    CachedPodRequest entry{absl::HashOf(pod_text), std::string(pod_text), req};
    absl::MutexLock l(&requests_mu_);
    if (requests_.size() < kPodRequestCacheSize) {
      requests_.push_back(std::move(entry));
    } else {
      requests_[requests_next_] = std::move(entry);
      requests_next_ = (requests_next_ + 1) % kPodRequestCacheSize;
    }
  }
  return req;
}

std::vector<int64_t> Extender::ScoreNames(const placement::PodRequest& req,
                                          absl::Span<const std::string_view> names) const {
  std::vector<int64_t> out(names.size(), 0);
  // The policy's raw preference per node where the pod fits, then min-max
  // scaled over this request's nodes: the best gets 10, the worst 0, the
  // rest in proportion (rounded down, so only the best reach 10).
  std::vector<std::pair<size_t, double>> raw;
  raw.reserve(out.size());
  const std::shared_ptr<const placement::Workload> workload =
      options_.workload ? options_.workload() : nullptr;
  // Domain packing over the whole ledger, about a second old (docs/gangs.md
  // 4): kDuet's tie-break toward nodes whose clique/sub-block/block is
  // already in use. Only kDuet reads it. The first request builds it; the
  // refresher keeps it fresh, off the request path. The table's rows carry
  // each node's packing from the usage it holds.
  std::shared_ptr<const placement::DomainUsage> domains;
  if (options_.policy == placement::Policy::kDuet) {
    domains = table_.domains();
    if (domains == nullptr) {
      domains = domains_.Get(absl::Now(), [this] { return ledger_->Snapshot().nodes; });
      table_.SetDomains(domains);
    }
  }
  const placement::Scorer scorer(options_.policy, workload.get(), domains.get());
  // The raw preference only (Scorer::Raw's value from the table's row):
  // prioritize needs no device choice.
  table_.Read(names, [&](size_t i, const NodeTable::Row& row) {
    const placement::NodeLoad load = options_.load ? LoadOf(*row.view) : placement::NodeLoad{};
    std::optional<double> r = placement::PreparedRaw(scorer, row.free, load, req, row.packing);
    if (r.has_value()) raw.emplace_back(i, *r);
  });
  if (raw.empty()) return out;
  double lo = raw.front().second;
  double hi = lo;
  for (const auto& [i, r] : raw) {
    lo = std::min(lo, r);
    hi = std::max(hi, r);
  }
  for (const auto& [i, r] : raw) {
    out[i] = hi - lo < 1e-9 ? kMaxExtenderPriority
                            : static_cast<int64_t>(std::floor(
                                  kMaxExtenderPriority * (r - lo) / (hi - lo) + 1e-9));
  }
  return out;
}

absl::Status Extender::Hold(const PodRef& pod, const placement::PodRequest& req,
                            const std::string& node, std::string* devices) {
  absl::StatusOr<pods::PodHold> h = holds_.Hold(Owner::Pod(pod.uid, pod.ns, pod.name), node, req);
  if (!h.ok()) return h.status();
  *devices = DevicesText(h->holding.devices);
  if (!h->created) {
    // A retried bind: the holding from the first try is still there.
    retries_.fetch_add(1);
    return options_.wait_durable ? options_.wait_durable(h->seq) : absl::OkStatus();
  }
  if (options_.wait_durable) {
    absl::Status d = options_.wait_durable(h->seq);
    if (!d.ok()) {
      absl::Status rb = Rollback(pod, node);
      return absl::UnavailableError(absl::StrCat("the holding could not be made durable: ", d.message(),
                                                 rb.ok() ? "" : absl::StrCat("; rollback: ", rb.message())));
    }
  }
  return absl::OkStatus();
}

absl::Status Extender::HoldMember(const PodRef& pod, const std::string& node, std::string* devices) {
  absl::StatusOr<gang::MemberBind> b = options_.gangs->BindMember(pod.uid, node);
  if (!b.ok()) return b.status();
  *devices = DevicesText(b->holding.devices);
  if (!b->created) retries_.fetch_add(1);
  if (!options_.wait_durable) return absl::OkStatus();
  absl::Status d = options_.wait_durable(b->seq);
  if (d.ok()) return absl::OkStatus();
  absl::Status rb = absl::OkStatus();
  if (b->created) {
    rolled_back_.fetch_add(1);
    rb = options_.gangs->UnbindMember(pod.uid);
  }
  return absl::UnavailableError(absl::StrCat("the holding could not be made durable: ", d.message(),
                                             rb.ok() ? "" : absl::StrCat("; rollback: ", rb.message())));
}

absl::Status Extender::Rollback(const PodRef& pod, const std::string& node) {
  rolled_back_.fetch_add(1);
  absl::Status s = holds_.Release(Owner::Pod(pod.uid, pod.ns, pod.name), node);
  if (!s.ok()) {
    // The Slurm sync releases it once Slurm answers again (or the pod's
    // absence is seen); nothing is released here on a guess.
    spdlog::error("extender: rollback of pod {}/{} on {} failed: {}", pod.ns, pod.name, node,
                  s.ToString());
  }
  return s;
}

absl::Status Extender::Refuse(const BindingArgs& args, const std::string& uid, absl::Status status) {
  refused_.fetch_add(1);
  const std::string msg = absl::StrCat("duet: cannot bind pod ", args.pod_namespace, "/",
                                       args.pod_name, " to node ", args.node, ": ", status.message());
  // Logged by Bind, with the rest of the bind's line.
  if (options_.on_refusal) {
    k8s::EventSpec e;
    e.object_kind = "Pod";
    e.object_namespace = args.pod_namespace;
    e.object_name = args.pod_name;
    e.object_uid = uid;
    e.type = "Warning";
    e.reason = "DuetBindRefused";
    e.message = msg;
    options_.on_refusal(e);
  }
  return absl::Status(status.code(), msg);
}

absl::Status Extender::Bind(const BindingArgs& args, const std::string& who) {
  std::string devices;
  absl::Status s = BindAndHold(args, &devices);
  // One line per bind, whatever its outcome (the security log of who used
  // duet-bridge's pods/binding permission).
  const std::string caller = who.empty() ? "unknown" : who;
  if (s.ok()) {
    spdlog::info(
        "extender bind: result=bound caller=\"{}\" pod={}/{} uid={} node={} devices=[{}]", caller,
        args.pod_namespace, args.pod_name, args.pod_uid, args.node, devices);
  } else {
    spdlog::warn(
        "extender bind: result=refused caller=\"{}\" pod={}/{} uid={} node={} devices=[] "
        "error=\"{}\"",
        caller, args.pod_namespace, args.pod_name, args.pod_uid, args.node, std::string(s.message()));
  }
  return s;
}

absl::Status Extender::BindAndHold(const BindingArgs& args, std::string* held) {
  // kube-scheduler always sends the uid (its Binding's); without it a
  // replaced pod of the same name could be bound.
  if (args.pod_uid.empty()) {
    return Refuse(args, "", absl::InvalidArgumentError("ExtenderBindingArgs.PodUID: must be set"));
  }
  absl::StatusOr<nlohmann::json> pod_json = api_->GetPod(args.pod_namespace, args.pod_name);
  if (!pod_json.ok()) return Refuse(args, args.pod_uid, pod_json.status());
  PodRef pod = PodRefOf(*pod_json);
  pod.ns = args.pod_namespace;
  pod.name = args.pod_name;
  if (pod.uid != args.pod_uid) {
    return Refuse(args, args.pod_uid,
                  absl::AbortedError(absl::StrCat("the pod was replaced (uid ", pod.uid,
                                                  ", the binding is for ", args.pod_uid, ")")));
  }
  // Only duet's pods: anyone who reaches the extender must not borrow the
  // bridge's pods/binding permission for another scheduler's pod.
  const nlohmann::json* spec = k8s::Field(*pod_json, "spec");
  const nlohmann::json* scheduler = spec == nullptr ? nullptr : k8s::Field(*spec, "schedulerName");
  const std::string scheduler_name =
      scheduler != nullptr && scheduler->is_string() ? scheduler->get<std::string>() : "";
  if (std::find(options_.scheduler_names.begin(), options_.scheduler_names.end(),
                scheduler_name) == options_.scheduler_names.end()) {
    return Refuse(args, pod.uid,
                  absl::PermissionDeniedError(absl::StrCat(
                      "the pod's spec.schedulerName is \"", scheduler_name,
                      "\", not one of duet's (extender.scheduler_names: ",
                      absl::StrJoin(options_.scheduler_names, ", "), ")")));
  }
  if (!pod.node_name.empty()) {
    if (pod.node_name == args.node) {
      retries_.fetch_add(1);
      return absl::OkStatus();  // bound by an earlier try whose answer was lost
    }
    return Refuse(args, pod.uid,
                  absl::FailedPreconditionError(absl::StrCat("already bound to node ", pod.node_name)));
  }
  absl::StatusOr<placement::PodRequest> req = ParsePodRequest(*pod_json);
  if (!req.ok()) return Refuse(args, pod.uid, req.status());

  absl::StatusOr<std::optional<gang::GangSpec>> gang_spec = GangOf(*pod_json);
  if (!gang_spec.ok()) return Refuse(args, pod.uid, gang_spec.status());
  const bool member = gang_spec->has_value();
  const bool devices = req->count > 0;
  if (member) {
    // Only the member's slot's node, with the slot's devices.
    absl::Status h = HoldMember(pod, args.node, held);
    if (!h.ok()) return Refuse(args, pod.uid, h);
  } else if (devices) {
    absl::Status h = Hold(pod, *req, args.node, held);
    if (!h.ok()) return Refuse(args, pod.uid, h);
  }
  absl::Status b = api_->Bind(pod.ns, pod.name, pod.uid, args.node);
  if (!b.ok() && (b.code() == absl::StatusCode::kAborted ||
                  b.code() == absl::StatusCode::kAlreadyExists)) {
    // 409: already bound. Success when it is bound to this node (an earlier
    // try's POST landed but its answer was lost).
    absl::StatusOr<nlohmann::json> again = api_->GetPod(pod.ns, pod.name);
    if (again.ok()) {
      const PodRef now = PodRefOf(*again);
      if (now.uid == pod.uid && now.node_name == args.node) b = absl::OkStatus();
    }
  }
  if (!b.ok()) {
    absl::Status rb = absl::OkStatus();
    if (member) {
      rolled_back_.fetch_add(1);
      rb = options_.gangs->UnbindMember(pod.uid);
    } else if (devices) {
      rb = Rollback(pod, args.node);
    }
    return Refuse(args, pod.uid,
                  absl::Status(b.code(), absl::StrCat("binding: ", b.message(),
                                                      rb.ok() ? "" : absl::StrCat("; rollback: ", rb.message()))));
  }
  bound_.fetch_add(1);
  return absl::OkStatus();
}

BindStats Extender::stats() const {
  BindStats s;
  s.bound = bound_.load();
  s.refused = refused_.load();
  s.rolled_back = rolled_back_.load();
  s.retries_idempotent = retries_.load();
  return s;
}

}  // namespace extender
}  // namespace duet
