#include "bridge/server/service.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bridge/api/convert.h"
#include "bridge/api/validate.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "common/reason.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/server_builder.h"

namespace duet {
namespace {

std::string Metadata(const grpc::ServerContextBase* ctx, const char* key) {
  auto it = ctx->client_metadata().find(key);
  if (it == ctx->client_metadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// The call's credentials, "" where absent.
SlurmCallerCredentials CallerCredentials(const grpc::ServerContextBase* ctx) {
  return {Metadata(ctx, slurm_munge::kMetadataKey), Metadata(ctx, slurm_key::kMetadataKey)};
}

// Hold and PlacePod while not serving.
absl::Status NotGrantingError() {
  return WithReason(absl::UnavailableError("duet-bridge is not granting holdings"),
                    v1::reason::kNotServing);
}

// Who a WatchNodes stream counts against: the peer's address without its
// port, so that many connections from one host are one caller. Not the
// bearer token (WatchNodes checks none, so a caller could make up a new one
// per stream), nor a TLS client certificate (many duet-nodes may share one).
// The unix socket's callers are trusted by its file permissions and gRPC
// does not tell them apart: they are one caller.
std::string WatchCaller(const grpc::CallbackServerContext& ctx) {
  const std::string peer = ctx.peer();  // "ipv4:10.0.0.5:41234", "ipv6:[::1]:41234", "unix:..."
  if (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:")) {
    return peer.substr(0, peer.rfind(':'));
  }
  if (absl::StartsWith(peer, "unix")) return peer.substr(0, peer.find(':'));
  return peer;
}

// Node checks by owner: a pod's node is a Kubernetes Node; a Slurm step's is
// whatever slurmd calls it (CheckNodeName says why that differs).
absl::Status CheckNodeFor(const Owner& owner, const std::string& node) {
  return owner.holder_class() == HolderClass::kPod ? CheckKubeNodeName("node", node)
                                                   : CheckNodeName("node", node);
}

google::protobuf::Timestamp NowProto() {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(absl::Now()));
}

}  // namespace

// ---------------------------------------------------------------------------
// WatchNodes: one reactor per stream. Events queue up to a bound; past it the
// queue is dropped and the client gets TYPE_RESYNC followed by fresh state of
// every watched node. Per node, an event older than what was already sent is
// skipped, so the initial state and racing updates never go backwards.
//
// Thread-safety: `mu_` guards the queue and the write state. Push runs under
// the ledger's lock; OnWriteDone/OnCancel/OnDone run on gRPC threads.

class LedgerService::WatchReactor final : public grpc::ServerWriteReactor<v1::NodeEvent>,
                                          public WatchHub::Subscriber {
 public:
  WatchReactor(LedgerService* service, std::set<std::string> names)
      : service_(service), names_(std::move(names)) {}

  // The stream holds a slot of `caller` (TakeWatchSlot), given back in OnDone.
  void HoldSlot(std::string caller) {
    caller_ = std::move(caller);
    has_slot_ = true;
  }

  // Subscribes, then queues the current state ahead of any update that raced
  // in; updates no newer than that state are skipped by generation.
  void Begin(const Ledger* ledger) {
    service_->hub_->Add(this);
    subscribed_ = true;
    LedgerSnapshot snap = ledger->Snapshot();
    absl::MutexLock lock(&mu_);
    std::deque<Event> initial;
    for (const auto& v : snap.nodes) {
      if (names_.empty() || names_.count(v->spec.name)) {
        initial.push_back({v1::NodeEvent::TYPE_INITIAL, v});
      }
    }
    queue_.insert(queue_.begin(), initial.begin(), initial.end());
    started_ = true;
    MaybeWriteLocked();
  }

  void Close(const std::string& why) override {
    absl::MutexLock lock(&mu_);
    FinishLocked(ToGrpc(WithReason(absl::UnavailableError(why), v1::reason::kNotServing)));
  }

  // Ends the stream before it started (limits, unknown names).
  void Refuse(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }

  void Push(v1::NodeEvent::Type type, const std::shared_ptr<const NodeView>& view) override {
    if (!names_.empty() && !names_.count(view->spec.name)) return;
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    if (queue_.size() >= service_->options_.max_watch_queue) {
      queue_.clear();
      overflow_ = true;  // handled in OnWriteDone, which is never under the ledger's lock
      return;
    }
    queue_.push_back({type, view});
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed"));
      return;
    }
    if (overflow_) {
      overflow_ = false;
      queue_.clear();
      queue_.push_back({v1::NodeEvent::TYPE_RESYNC, nullptr});
      sent_generation_.clear();
      mu_.Unlock();
      LedgerSnapshot snap = service_->ledger_->Snapshot();  // never under mu_
      mu_.Lock();
      for (const auto& v : snap.nodes) {
        if (names_.empty() || names_.count(v->spec.name)) {
          queue_.push_back({v1::NodeEvent::TYPE_UPDATED, v});
        }
      }
    }
    MaybeWriteLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    if (subscribed_) service_->hub_->Remove(this);
    if (has_slot_) service_->ReleaseWatchSlot(caller_);
    delete this;
  }

 private:
  struct Event {
    v1::NodeEvent::Type type;
    std::shared_ptr<const NodeView> view;
  };

  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (started_ && !writing_ && !finishing_ && !queue_.empty()) {
      Event e = std::move(queue_.front());
      queue_.pop_front();
      current_.Clear();
      current_.set_type(e.type);
      *current_.mutable_time() = NowProto();
      if (e.view != nullptr) {
        const std::string& name = e.view->spec.name;
        if (e.type == v1::NodeEvent::TYPE_REMOVED) {
          sent_generation_.erase(name);
        } else {
          auto it = sent_generation_.find(name);
          if (it != sent_generation_.end() && it->second >= e.view->generation) continue;
          sent_generation_[name] = e.view->generation;
        }
        ToProto(*e.view, current_.mutable_node());
      }
      writing_ = true;
      StartWrite(&current_);
    }
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    finishing_ = true;
    queue_.clear();
    Finish(status);
  }

  LedgerService* const service_;
  const std::set<std::string> names_;
  // Set before the stream starts, read in OnDone: no lock needed.
  std::string caller_;
  bool has_slot_ = false;
  bool subscribed_ = false;
  absl::Mutex mu_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> sent_generation_ ABSL_GUARDED_BY(mu_);
  v1::NodeEvent current_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool overflow_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------
// LedgerService

LedgerService::LedgerService(Ledger* ledger, Durability* durability, WatchHub* hub,
                             Metrics* metrics, Options options)
    : ledger_(ledger),
      durability_(durability),
      hub_(hub),
      metrics_(metrics),
      options_(options),
      pod_holds_(ledger, options_.placeholders, options_.pod_holds) {}

LedgerService::~LedgerService() { StopStepThreads(); }

// A step queue's tag.
class LedgerService::StepTag {
 public:
  virtual ~StepTag() = default;
  // The tag came back from the queue with `ok`.
  virtual void Proceed(bool ok) = 0;
};

// One async Hold or Release: requested (its tag comes back when a call
// arrives, or not ok when the server shut down first), then run on the step
// thread that got it. It is answered there, or once its change is durable
// from the journal's waiter thread; its tag comes back once more when the
// answer has gone (or the caller had), and the call is deleted.
template <class Request, class Response>
class LedgerService::StepCall final : public StepTag {
 public:
  using Body = void (LedgerService::*)(const UnaryCall&, const grpc::ServerContextBase&,
                                       const Request*, Response*);
  using AskFn = void (LedgerServiceBase::*)(grpc::ServerContext*, Request*,
                                            grpc::ServerAsyncResponseWriter<Response>*,
                                            grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                            void*);

  // Asks for the next call of the method, unless the queue is shutting down.
  static void Ask(LedgerService* service, const char* method, AskFn ask, Body body) {
    absl::MutexLock lock(&service->step_mu_);
    if (service->step_stopping_) return;
    auto* c = new StepCall(service, method, ask, body);
    grpc::ServerCompletionQueue* cq = service->step_cq_.get();
    (service->*ask)(&c->ctx_, &c->request_, &c->responder_, cq, cq, static_cast<StepTag*>(c));
  }

  void Proceed(bool ok) override {
    if (started_ || !ok) {  // the answer went, or the server shut down before a call came
      delete this;
      return;
    }
    started_ = true;
    Ask(service_, method_, ask_, body_);
    UnaryCall call{absl::Now(), method_, nullptr, [this](const grpc::Status& status) {
                     if (status.ok()) {
                       responder_.Finish(response_, status, static_cast<StepTag*>(this));
                     } else {
                       responder_.FinishWithError(status, static_cast<StepTag*>(this));
                     }
                   }};
    (service_->*body_)(call, ctx_, &request_, &response_);
  }

 private:
  StepCall(LedgerService* service, const char* method, AskFn ask, Body body)
      : service_(service), method_(method), ask_(ask), body_(body), responder_(&ctx_) {}

  LedgerService* const service_;
  const char* const method_;
  const AskFn ask_;
  const Body body_;
  grpc::ServerContext ctx_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
  bool started_ = false;
};

void LedgerService::RegisterWith(grpc::ServerBuilder* builder) {
  builder->RegisterService(this);
  step_cq_ = builder->AddCompletionQueue();
}

void LedgerService::StartStepThreads(int threads) {
  {
    absl::MutexLock lock(&step_mu_);
    if (step_cq_ == nullptr || step_stopping_ || !step_threads_.empty()) return;
    for (int i = 0; i < std::max(threads, 1); ++i) {
      step_threads_.emplace_back([cq = step_cq_.get()] {
        void* tag = nullptr;
        bool ok = false;
        while (cq->Next(&tag, &ok)) static_cast<StepTag*>(tag)->Proceed(ok);
      });
    }
  }
  StepCall<v1::HoldRequest, v1::HoldResponse>::Ask(this, "Hold", &LedgerServiceBase::RequestHold,
                                                   &LedgerService::HoldCall);
  StepCall<v1::ReleaseRequest, v1::ReleaseResponse>::Ask(
      this, "Release", &LedgerServiceBase::RequestRelease, &LedgerService::ReleaseCall);
}

void LedgerService::StopStepThreads() {
  {
    absl::MutexLock lock(&step_mu_);
    if (step_cq_ == nullptr || step_stopping_) return;
    step_stopping_ = true;
    step_cq_->Shutdown();
  }
  // Each thread returns once the queue is drained: the server's Shutdown
  // gave back every call still asked for.
  for (std::thread& t : step_threads_) t.join();
  step_threads_.clear();
  void* tag = nullptr;
  bool ok = false;
  while (step_cq_->Next(&tag, &ok)) static_cast<StepTag*>(tag)->Proceed(false);
}

void LedgerService::NodeToProto(const NodeView& view, v1::Node* out) const {
  ToProto(view, out);
  if (!options_.slurm_state) return;
  auto [state, reason] = options_.slurm_state(view.spec.name);
  out->set_slurm_state(std::move(state));
  out->set_slurm_reason(std::move(reason));
}

std::optional<HolderClass> LedgerService::BlockingClass(const HoldRequest& request) const {
  if (request.devices.empty()) return std::nullopt;  // "any N": no room, not a conflict
  std::optional<HolderClass> out;
  for (const Holding& h : ledger_->ListHoldings(request.node)) {
    if (h.owner.SameGroup(request.owner)) continue;
    for (const HeldDevice& d : h.devices) {
      const bool named =
          std::any_of(request.devices.begin(), request.devices.end(),
                      [&](const HeldDevice& w) { return w.kind == d.kind && w.index == d.index; });
      if (!named) continue;
      // A pod on the device outweighs a Slurm job in the label: that is the
      // conflict duet exists to prevent.
      if (!out || h.owner.holder_class() == HolderClass::kPod) out = h.owner.holder_class();
    }
  }
  return out;
}

absl::Status LedgerService::AuthorizeCall(const grpc::ServerContextBase& ctx, const char* method,
                                          const std::string& node, const Owner& owner,
                                          const std::optional<slurm_munge::Binding>& binding,
                                          std::string* who) const {
  *who = absl::StrCat("unauthenticated(", ctx.peer(), ")");
  if (owner.holder_class() == HolderClass::kSlurm) {
    if (!options_.authorize_slurm_owner) return absl::OkStatus();
    if (!binding) return absl::InternalError(absl::StrCat(method, ": no credential binding"));
    return options_.authorize_slurm_owner(CallerCredentials(&ctx), *binding, who);
  }
  if (!options_.authorize_call) return absl::OkStatus();
  return options_.authorize_call(ctx, method, node, owner, who);
}

void LedgerService::Audit(const char* method, const std::string& who, const std::string& node,
                          const Owner& owner, const std::vector<HeldDevice>& devices,
                          bool changed) const {
  if (options_.audit == nullptr) return;
  AuditRecord r;
  r.method = method;
  r.who = who;
  r.node = node;
  r.owner = owner.ToString();
  for (const HeldDevice& d : devices) {
    absl::StrAppend(&r.devices, r.devices.empty() ? "" : ",", DeviceKindName(d.kind), d.index);
    if (d.milli != kWholeDevice) absl::StrAppend(&r.devices, "@", d.milli, "m");
  }
  r.changed = changed;
  options_.audit->Record(r);
}

grpc::ServerUnaryReactor* LedgerService::Answer(const UnaryCall& call, const absl::Status& status) {
  if (metrics_ != nullptr) {
    metrics_->ObserveRpc(call.method, status.code(),
                         absl::ToDoubleSeconds(absl::Now() - call.start));
  }
  if (call.finish) {
    call.finish(ToGrpc(status));
  } else {
    call.reactor->Finish(ToGrpc(status));
  }
  return call.reactor;
}

grpc::ServerUnaryReactor* LedgerService::Refuse(const UnaryCall& call, const absl::Status& status) {
  if (metrics_ != nullptr) metrics_->CountRefusal(status.code());
  return Answer(call, status);
}

grpc::ServerUnaryReactor* LedgerService::AnswerWhenDurable(const UnaryCall& call, uint64_t seq,
                                                           std::function<void()> on_durable) {
  durability_->WhenDurable(seq, [this, call, on_durable](absl::Status s) {
    if (!s.ok()) {
      // The change is in memory but not on disk: stop granting (I3) until an
      // operator restarts the bridge, which recovers from the journal.
      SetServing(false);
      if (metrics_ != nullptr) metrics_->SetServing(false);
      Answer(call, WithReason(absl::UnavailableError(absl::StrCat(
                                  "the journal could not persist the change: ", s.message())),
                              v1::reason::kNotServing));
      return;
    }
    on_durable();
    Answer(call, absl::OkStatus());
  });
  return call.reactor;
}

absl::Status LedgerService::TakeWatchSlot(const std::string& caller) {
  absl::MutexLock lock(&watch_mu_);
  auto refuse = [](const char* scope, int limit, const char* whose) {
    return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                          "too many watch streams ", whose, " (max ", limit, ")")),
                      v1::reason::kTooManyWatches,
                      {{"scope", scope}, {"limit", absl::StrCat(limit)}});
  };
  const int per_caller = options_.max_watch_streams_per_caller;
  auto it = watch_streams_by_caller_.find(caller);
  if (per_caller > 0 && it != watch_streams_by_caller_.end() && it->second >= per_caller) {
    return refuse("caller", per_caller, "from this caller");
  }
  if (watch_streams_ >= options_.max_watch_streams) {
    return refuse("total", options_.max_watch_streams, "on this bridge");
  }
  ++watch_streams_by_caller_[caller];
  ++watch_streams_;
  if (metrics_ != nullptr) metrics_->SetWatchStreams(watch_streams_);
  return absl::OkStatus();
}

void LedgerService::ReleaseWatchSlot(const std::string& caller) {
  absl::MutexLock lock(&watch_mu_);
  auto it = watch_streams_by_caller_.find(caller);
  if (it != watch_streams_by_caller_.end() && --it->second <= 0) watch_streams_by_caller_.erase(it);
  --watch_streams_;
  if (metrics_ != nullptr) metrics_->SetWatchStreams(watch_streams_);
}

grpc::ServerUnaryReactor* LedgerService::ListNodes(grpc::CallbackServerContext* ctx,
                                                   const v1::ListNodesRequest* req,
                                                   v1::ListNodesResponse* resp) {
  const UnaryCall call = StartCall(ctx, "ListNodes");
  // Bounded and distinct names keep the answer within the ledger's own size:
  // 200,000 copies of one name used to be answered 200,000 times (90 MB).
  if (absl::Status v = CheckNodeNames("names", req->names()); !v.ok()) return Answer(call, v);
  if (req->names().empty()) {
    for (const auto& view : ledger_->Snapshot().nodes) NodeToProto(*view, resp->add_nodes());
  } else {
    for (const std::string& name : req->names()) {
      auto view = ledger_->GetNode(name);
      if (view == nullptr) return Answer(call, UnknownNodeError(name));
      NodeToProto(*view, resp->add_nodes());
    }
  }
  return Answer(call, absl::OkStatus());
}

grpc::ServerUnaryReactor* LedgerService::GetNode(grpc::CallbackServerContext* ctx,
                                                 const v1::GetNodeRequest* req, v1::Node* resp) {
  const UnaryCall call = StartCall(ctx, "GetNode");
  if (absl::Status v = CheckNodeName("name", req->name()); !v.ok()) return Answer(call, v);
  auto view = ledger_->GetNode(req->name());
  if (view == nullptr) return Answer(call, UnknownNodeError(req->name()));
  NodeToProto(*view, resp);
  return Answer(call, absl::OkStatus());
}

void LedgerService::HoldCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                             const v1::HoldRequest* req, v1::HoldResponse* resp) {
  if (!serving()) return (void)Refuse(call, NotGrantingError());
  if (absl::Status v = CheckHoldSelection(*req); !v.ok()) return (void)Refuse(call, v);
  absl::StatusOr<HoldRequest> request = FromProto(*req);
  if (!request.ok()) return (void)Refuse(call, request.status());
  // Before the authorizer (which may ask the API server about the pod) and
  // the ledger (which journals what it grants and echoes names in errors).
  if (absl::Status v = CheckOwnerStrings(request->owner); !v.ok()) return (void)Refuse(call, v);
  if (absl::Status v = CheckNodeFor(request->owner, request->node); !v.ok()) {
    return (void)Refuse(call, v);
  }
  std::string who;
  if (absl::Status a = AuthorizeCall(ctx, call.method, request->node, request->owner,
                                     slurm_munge::BindingOf(*req), &who);
      !a.ok()) {
    return (void)Refuse(call, a);
  }
  absl::StatusOr<HoldResult> result = ledger_->Hold(*request);
  const bool slurm_conflict = !result.ok() && absl::IsResourceExhausted(result.status()) &&
                              request->owner.holder_class() == HolderClass::kSlurm;
  if (slurm_conflict && options_.pod_eviction_wait) {
    // A preemptor's step asking again while its devices' pod is evicted.
    if (std::optional<absl::Status> wait = options_.pod_eviction_wait(*request, false)) {
      return (void)Refuse(call, *wait);
    }
  }
  if (slurm_conflict && options_.resolve_slurm_conflict &&
      options_.resolve_slurm_conflict(*request)) {
    result = ledger_->Hold(*request);
    if (metrics_ != nullptr) metrics_->CountStaleRetry(result.ok());
  }
  if (!result.ok() && absl::IsResourceExhausted(result.status()) &&
      request->owner.holder_class() == HolderClass::kSlurm && options_.pod_eviction_wait) {
    // Not a conflict: the preemptor's devices are on their way.
    if (std::optional<absl::Status> wait = options_.pod_eviction_wait(*request, true)) {
      return (void)Refuse(call, *wait);
    }
  }
  if (!result.ok()) {
    if (metrics_ != nullptr && absl::IsResourceExhausted(result.status())) {
      if (std::optional<HolderClass> c = BlockingClass(*request)) metrics_->CountConflict(*c);
    }
    return (void)Refuse(call, result.status());
  }
  ToProto(result->holding, ledger_->GetNode(result->holding.node).get(), resp->mutable_holding());
  resp->set_created(result->created);
  AnswerWhenDurable(call, result->seq,
                    [this, created = result->created, owner = request->owner,
                     holding = result->holding, who = std::move(who)] {
                      if (created && metrics_ != nullptr) metrics_->CountGrant(owner);
                      Audit("Hold", who, holding.node, owner, holding.devices, created);
                    });
}

void LedgerService::ReleaseCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                                const v1::ReleaseRequest* req, v1::ReleaseResponse* resp) {
  if (!serving()) {
    return (void)Answer(call, WithReason(absl::UnavailableError("duet-bridge is not serving"),
                                         v1::reason::kNotServing));
  }
  absl::StatusOr<Owner> owner = FromProto(req->owner());
  if (!owner.ok()) return (void)Answer(call, owner.status());
  if (absl::Status v = CheckOwnerStrings(*owner); !v.ok()) return (void)Answer(call, v);
  if (absl::Status v = CheckNodeFor(*owner, req->node()); !v.ok()) return (void)Answer(call, v);
  std::string who;
  if (absl::Status a =
          AuthorizeCall(ctx, call.method, req->node(), *owner, slurm_munge::BindingOf(*req), &who);
      !a.ok()) {
    return (void)Answer(call, a);
  }
  absl::StatusOr<ReleaseResult> result = ledger_->Release(req->node(), *owner);
  if (!result.ok()) return (void)Answer(call, result.status());
  resp->set_released(result->released);
  if (result->released) ToProto(result->holding, resp->mutable_holding());
  std::vector<HeldDevice> devices;
  if (result->released) devices = result->holding.devices;
  AnswerWhenDurable(call, result->seq,
                    [this, released = result->released, o = *owner, node = req->node(),
                     devices = std::move(devices), who = std::move(who)] {
                      if (released && metrics_ != nullptr) metrics_->CountRelease(o);
                      Audit("Release", who, node, o, devices, released);
                    });
}

grpc::ServerUnaryReactor* LedgerService::ListHoldings(grpc::CallbackServerContext* ctx,
                                                      const v1::ListHoldingsRequest* req,
                                                      v1::ListHoldingsResponse* resp) {
  const UnaryCall call = StartCall(ctx, "ListHoldings");
  if (!req->node().empty()) {
    if (absl::Status v = CheckNodeName("node", req->node()); !v.ok()) return Answer(call, v);
  }
  if (!req->node().empty() && ledger_->GetNode(req->node()) == nullptr) {
    return Answer(call, UnknownNodeError(req->node()));
  }
  std::map<std::string, std::shared_ptr<const NodeView>> views;
  for (const Holding& h : ledger_->ListHoldings(req->node())) {
    auto& view = views[h.node];
    if (view == nullptr) view = ledger_->GetNode(h.node);
    ToProto(h, view.get(), resp->add_holdings());
  }
  return Answer(call, absl::OkStatus());
}

grpc::ServerUnaryReactor* LedgerService::GetWorkload(grpc::CallbackServerContext* ctx,
                                                     const v1::GetWorkloadRequest* req,
                                                     v1::WorkloadResponse* resp) {
  const UnaryCall call = StartCall(ctx, "GetWorkload");
  if (options_.workload == nullptr) {
    return Answer(call, absl::UnimplementedError("this server learns no workload"));
  }
  const placement::WorkloadModel::Stats s = options_.workload->stats(call.start);
  for (const placement::WorkloadModel::ShapeStat& shape : s.shapes) {
    v1::WorkloadShape* out = resp->add_shapes();
    out->set_kind(shape.shape.kind == DeviceKind::kTpu ? v1::DEVICE_KIND_TPU : v1::DEVICE_KIND_GPU);
    out->set_count(shape.shape.count);
    out->set_milli(shape.shape.milli);
    for (const std::string& m : shape.shape.models) out->add_models(m);
    out->set_cpu_milli(shape.shape.cpu_milli);
    out->set_memory_mib(shape.shape.memory_mib);
    out->set_weight(shape.weight);
    out->set_share(shape.share);
  }
  resp->set_tracked(static_cast<uint32_t>(s.tracked));
  resp->set_coverage(s.coverage);
  resp->set_total_weight(s.total_weight);
  resp->set_arrivals(s.arrivals);
  resp->set_duplicates(s.duplicates);
  resp->set_evictions(s.evictions);
  resp->set_half_life(absl::FormatDuration(options_.workload->options().half_life));
  return Answer(call, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::NodeEvent>* LedgerService::WatchNodes(
    grpc::CallbackServerContext* ctx, const v1::WatchNodesRequest* req) {
  const absl::Status valid = CheckNodeNames("names", req->names());
  std::set<std::string> names;
  if (valid.ok()) names.insert(req->names().begin(), req->names().end());
  auto* reactor = new WatchReactor(this, std::move(names));
  if (!valid.ok()) {
    reactor->Refuse(ToGrpc(valid));
    return reactor;
  }
  std::string caller = WatchCaller(*ctx);
  if (absl::Status slot = TakeWatchSlot(caller); !slot.ok()) {
    reactor->Refuse(ToGrpc(slot));
    return reactor;
  }
  reactor->HoldSlot(std::move(caller));
  for (const std::string& n : req->names()) {
    if (ledger_->GetNode(n) == nullptr) {
      reactor->Refuse(ToGrpc(UnknownNodeError(n)));
      return reactor;
    }
  }
  reactor->Begin(ledger_);
  return reactor;
}

// ---------------------------------------------------------------------------
// PlacePod: a placeholder made on the spot for a pod that bypassed the duet
// scheduler (asked by duet-node from Allocate).

grpc::ServerUnaryReactor* LedgerService::PlacePod(grpc::CallbackServerContext* ctx,
                                                  const v1::PlacePodRequest* req,
                                                  v1::Holding* resp) {
  const UnaryCall call = StartCall(ctx, "PlacePod");
  if (!serving()) return Refuse(call, NotGrantingError());
  const Owner pod = Owner::Pod(req->pod().uid(), req->pod().namespace_(), req->pod().name());
  if (absl::Status v = ValidateOwner(pod); !v.ok() || pod.pod_uid.empty()) {
    return Refuse(call, absl::InvalidArgumentError(
                            absl::StrCat("pod: ", v.ok() ? "uid must be set" : v.message())));
  }
  if (absl::Status v = CheckOwnerStrings(pod); !v.ok()) return Refuse(call, v);
  if (absl::Status v = CheckKubeNodeName("node", req->node()); !v.ok()) return Refuse(call, v);
  if (absl::Status v = CheckPlacePodAmounts(*req); !v.ok()) return Refuse(call, v);
  std::string who;
  if (absl::Status a = AuthorizeCall(*ctx, call.method, req->node(), pod, std::nullopt, &who);
      !a.ok()) {
    return Refuse(call, a);
  }
  if (req->gpus() == 0 && req->tpus() == 0) {
    return Refuse(call, absl::InvalidArgumentError("gpus, tpus: at least one must be non-zero"));
  }
  if (req->gpus() != 0 && req->tpus() != 0) {
    return Refuse(call, absl::InvalidArgumentError(
                            "gpus, tpus: duet places a pod on one device kind at a time"));
  }
  placement::PodRequest request;
  request.kind = req->gpus() != 0 ? DeviceKind::kGpu : DeviceKind::kTpu;
  request.count = req->gpus() != 0 ? req->gpus() : req->tpus();
  request.cpu_milli = uint64_t{req->cpus()} * 1000;
  request.memory_mib = req->memory_mib();
  // The same transaction as the extender's bind, idempotent per pod and node.
  absl::StatusOr<pods::PodHold> held = pod_holds_.Hold(pod, req->node(), request);
  if (!held.ok()) {
    return Refuse(
        call, WithPrefix(held.status(), absl::StrCat("pod ", pod.pod_namespace, "/", pod.pod_name,
                                                     " on ", req->node(), ": ")));
  }
  ToProto(held->holding, ledger_->GetNode(held->holding.node).get(), resp);
  return AnswerWhenDurable(call, held->seq,
                           [this, holding = held->holding, created = held->created,
                            who = std::move(who)] {
                             if (metrics_ != nullptr && created) metrics_->CountGrant(holding.owner);
                             Audit("PlacePod", who, holding.node, holding.owner, holding.devices,
                                   created);
                           });
}

}  // namespace duet
