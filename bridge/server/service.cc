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
std::string WatchCaller(const grpc::ServerContextBase& ctx) {
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
// LedgerService

LedgerService::LedgerService(Ledger* ledger, Durability* durability, WatchHub* hub,
                             Metrics* metrics, Options options)
    : ledger_(ledger),
      durability_(durability),
      hub_(hub),
      metrics_(metrics),
      options_(options),
      pod_holds_(ledger, options_.placeholders, options_.pod_holds) {}

LedgerService::~LedgerService() { StopCallThreads(); }

// A completion queue's tag.
class LedgerService::CallTag {
 public:
  virtual ~CallTag() = default;
  // The tag came back from the queue with `ok`.
  virtual void Proceed(bool ok) = 0;
};

// One async unary call: requested (its tag comes back when a call arrives,
// or not ok when the server shut down first), then run on the thread that
// got it. It is answered there, or once its change is durable from the
// journal's waiter thread; its tag comes back once more when the answer has
// gone (or the caller had), and the call is deleted.
template <class Request, class Response>
class LedgerService::UnaryCallOf final : public CallTag {
 public:
  using Body = void (LedgerService::*)(const UnaryCall&, const grpc::ServerContextBase&,
                                       const Request*, Response*);
  using AskFn = void (LedgerServiceBase::*)(grpc::ServerContext*, Request*,
                                            grpc::ServerAsyncResponseWriter<Response>*,
                                            grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                            void*);

  // Asks `cq` for the next call of the method, unless the queues are
  // shutting down.
  static void Ask(LedgerService* service, grpc::ServerCompletionQueue* cq, const char* method,
                  AskFn ask, Body body) {
    absl::MutexLock lock(&service->calls_mu_);
    if (service->calls_stopping_) return;
    auto* c = new UnaryCallOf(service, cq, method, ask, body);
    (service->*ask)(&c->ctx_, &c->request_, &c->responder_, cq, cq, static_cast<CallTag*>(c));
  }

  void Proceed(bool ok) override {
    if (started_ || !ok) {  // the answer went, or the server shut down before a call came
      delete this;
      return;
    }
    started_ = true;
    Ask(service_, cq_, method_, ask_, body_);
    UnaryCall call{absl::Now(), method_, [this](const grpc::Status& status) {
                     if (status.ok()) {
                       responder_.Finish(response_, status, static_cast<CallTag*>(this));
                     } else {
                       responder_.FinishWithError(status, static_cast<CallTag*>(this));
                     }
                   }};
    (service_->*body_)(call, ctx_, &request_, &response_);
  }

 private:
  UnaryCallOf(LedgerService* service, grpc::ServerCompletionQueue* cq, const char* method,
              AskFn ask, Body body)
      : service_(service), cq_(cq), method_(method), ask_(ask), body_(body), responder_(&ctx_) {}

  LedgerService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  const char* const method_;
  const AskFn ask_;
  const Body body_;
  grpc::ServerContext ctx_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
  bool started_ = false;
};

// ---------------------------------------------------------------------------
// WatchNodes: one call object per stream, served on the calls' queue. Events
// queue up to a bound; past it the queue is dropped and the client gets
// TYPE_RESYNC followed by fresh state of every watched node. Per node, an
// event older than what was already sent is skipped, so the initial state and
// racing updates never go backwards. One write is in flight at a time; the
// stream's Finish waits for it.
//
// Thread-safety: `mu_` guards the queue, the write state and how many tags
// the queue still owes the call. Push runs under the hub's and the ledger's
// locks and Close under the hub's; the tags' handlers run on the service's
// threads. When the queue owes no more tags (the call is over: its done tag
// came, and every write and the Finish came back) the call leaves the hub
// and deletes itself.

class LedgerService::WatchCall final : public WatchHub::Subscriber {
 public:
  // Asks for the next WatchNodes call, unless the queues are shutting down.
  static void Ask(LedgerService* service) {
    absl::MutexLock lock(&service->calls_mu_);
    if (service->calls_stopping_) return;
    auto* w = new WatchCall(service);
    // Its tag comes back once the call ends, finished or cancelled, and
    // only for a call that arrived.
    w->ctx_.AsyncNotifyWhenDone(static_cast<CallTag*>(&w->done_tag_));
    grpc::ServerCompletionQueue* cq = service->calls_.cq.get();
    service->RequestWatchNodes(&w->ctx_, &w->request_, &w->writer_, cq, cq,
                               static_cast<CallTag*>(&w->request_tag_));
  }

  void Close(const std::string& why) override {
    absl::MutexLock lock(&mu_);
    FinishLocked(ToGrpc(WithReason(absl::UnavailableError(why), v1::reason::kNotServing)));
  }

  void Push(v1::NodeEvent::Type type, const std::shared_ptr<const NodeView>& view) override {
    if (!names_.empty() && !names_.count(view->spec.name)) return;
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    if (queue_.size() >= service_->options_.max_watch_queue) {
      // The queue grows only while a write is in flight or before the stream
      // starts, which writes: OnWriteDone, never under the ledger's lock,
      // sends the state instead.
      queue_.clear();
      overflow_ = true;
      return;
    }
    queue_.push_back({type, view});
    MaybeWriteLocked();
  }

 private:
  // A tag of the call: which of its handlers the queue's answer goes to.
  class Tag final : public CallTag {
   public:
    Tag(WatchCall* call, void (WatchCall::*handler)(bool)) : call_(call), handler_(handler) {}
    void Proceed(bool ok) override { (call_->*handler_)(ok); }

   private:
    WatchCall* const call_;
    void (WatchCall::*const handler_)(bool);
  };

  struct Event {
    v1::NodeEvent::Type type;
    std::shared_ptr<const NodeView> view;
  };

  explicit WatchCall(LedgerService* service) : service_(service), writer_(&ctx_) {}

  void OnRequest(bool ok) {
    if (!ok) {  // the server shut down before a call came: no other tag comes
      delete this;
      return;
    }
    Ask(service_);
    {
      absl::MutexLock lock(&mu_);
      // The done tag, which may come back on another thread before this one
      // goes on, and Start's own turn, so that the call does not end under
      // it.
      owed_ += 2;
    }
    Start();
    bool over = false;
    {
      absl::MutexLock lock(&mu_);
      over = --owed_ == 0;
    }
    if (over) End();
  }

  // Checks the request and the limits, then subscribes and sends the state.
  void Start() {
    if (absl::Status valid = CheckNodeNames("names", request_.names()); !valid.ok()) {
      return Refuse(ToGrpc(valid));
    }
    names_.insert(request_.names().begin(), request_.names().end());
    std::string caller = WatchCaller(ctx_);
    if (absl::Status slot = service_->TakeWatchSlot(caller); !slot.ok()) {
      return Refuse(ToGrpc(slot));
    }
    caller_ = std::move(caller);
    has_slot_ = true;
    for (const std::string& n : request_.names()) {
      if (service_->ledger_->GetNode(n) == nullptr) return Refuse(ToGrpc(UnknownNodeError(n)));
    }
    Begin();
  }

  // Subscribes, then queues the current state ahead of any update that raced
  // in; updates no newer than that state are skipped by generation.
  void Begin() {
    service_->hub_->Add(this);
    subscribed_ = true;
    LedgerSnapshot snap = service_->ledger_->Snapshot();
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

  // Ends the stream before it started (limits, unknown names).
  void Refuse(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }

  void OnWriteDone(bool ok) {
    bool over = false;
    {
      absl::MutexLock lock(&mu_);
      --owed_;
      if (!ok) {
        writing_ = false;
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed"));
      } else {
        // writing_ stays set while the state is read again, so that no
        // write starts meanwhile (Push), nor another resync (a write that
        // ends on another thread): the client gets the resync mark, then
        // the state, then only what changed after it.
        std::vector<std::shared_ptr<const NodeView>> state;
        bool resync = false;
        while (overflow_ && !finishing_) {
          overflow_ = false;
          queue_.clear();
          mu_.Unlock();
          LedgerSnapshot snap = service_->ledger_->Snapshot();  // never under mu_
          mu_.Lock();
          state.clear();
          for (const auto& v : snap.nodes) {
            if (names_.empty() || names_.count(v->spec.name)) state.push_back(v);
          }
          resync = true;  // Push may have overflowed again meanwhile: read again
        }
        writing_ = false;
        if (finishing_) {
          SendFinishLocked();  // it waited for this write
        } else {
          if (resync) {
            // What Push queued meanwhile goes after the state; what it has
            // that is not newer is skipped by generation.
            std::deque<Event> front{{v1::NodeEvent::TYPE_RESYNC, nullptr}};
            for (auto& v : state) front.push_back({v1::NodeEvent::TYPE_UPDATED, std::move(v)});
            queue_.insert(queue_.begin(), front.begin(), front.end());
            sent_generation_.clear();
          }
          MaybeWriteLocked();
        }
      }
      over = owed_ == 0;
    }
    if (over) End();
  }

  void OnFinishDone(bool) {
    bool over = false;
    {
      absl::MutexLock lock(&mu_);
      --owed_;
      over = owed_ == 0;
    }
    if (over) End();
  }

  // The call ended: finished, or cancelled by the caller or the server's
  // shutdown. Nothing more is sent.
  void OnDone(bool) {
    bool over = false;
    {
      absl::MutexLock lock(&mu_);
      --owed_;
      done_ = true;
      finishing_ = true;
      queue_.clear();
      over = owed_ == 0;
    }
    if (over) End();
  }

  // Never under mu_: the hub's lock comes before it (Push).
  void End() {
    if (subscribed_) service_->hub_->Remove(this);
    if (has_slot_) service_->ReleaseWatchSlot(caller_);
    delete this;
  }

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
      ++owed_;
      writer_.Write(current_, static_cast<CallTag*>(&write_tag_));
    }
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    finishing_ = true;
    queue_.clear();
    finish_status_ = status;
    if (!writing_) SendFinishLocked();
  }

  void SendFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_sent_ || done_) return;
    finish_sent_ = true;
    ++owed_;
    writer_.Finish(finish_status_, static_cast<CallTag*>(&finish_tag_));
  }

  LedgerService* const service_;
  grpc::ServerContext ctx_;
  v1::WatchNodesRequest request_;
  grpc::ServerAsyncWriter<v1::NodeEvent> writer_;
  Tag request_tag_{this, &WatchCall::OnRequest};
  Tag write_tag_{this, &WatchCall::OnWriteDone};
  Tag finish_tag_{this, &WatchCall::OnFinishDone};
  Tag done_tag_{this, &WatchCall::OnDone};
  // Set before the call subscribes; read in Push and End.
  std::set<std::string> names_;
  std::string caller_;
  bool has_slot_ = false;
  bool subscribed_ = false;
  absl::Mutex mu_;
  int owed_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> sent_generation_ ABSL_GUARDED_BY(mu_);
  v1::NodeEvent current_ ABSL_GUARDED_BY(mu_);
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool overflow_ ABSL_GUARDED_BY(mu_) = false;
};

void LedgerService::RegisterWith(grpc::ServerBuilder* builder) {
  builder->RegisterService(this);
  calls_.cq = builder->AddCompletionQueue();
  place_.cq = builder->AddCompletionQueue();
}

void LedgerService::StartCallThreads(int threads, int place_threads) {
  {
    absl::MutexLock lock(&calls_mu_);
    if (calls_.cq == nullptr || calls_stopping_ || calls_started_) return;
    calls_started_ = true;
    for (CallQueue* q : {&calls_, &place_}) {
      const int n = std::max(q == &calls_ ? threads : place_threads, 1);
      for (int i = 0; i < n; ++i) {
        q->threads.emplace_back([cq = q->cq.get()] {
          void* tag = nullptr;
          bool ok = false;
          while (cq->Next(&tag, &ok)) static_cast<CallTag*>(tag)->Proceed(ok);
        });
      }
    }
  }
  AskAll();
}

void LedgerService::AskAll() {
  grpc::ServerCompletionQueue* cq = calls_.cq.get();
  using Base = LedgerServiceBase;
  using Self = LedgerService;
  UnaryCallOf<v1::ListNodesRequest, v1::ListNodesResponse>::Ask(
      this, cq, "ListNodes", &Base::RequestListNodes, &Self::ListNodesCall);
  UnaryCallOf<v1::GetNodeRequest, v1::Node>::Ask(this, cq, "GetNode", &Base::RequestGetNode,
                                                 &Self::GetNodeCall);
  UnaryCallOf<v1::HoldRequest, v1::HoldResponse>::Ask(this, cq, "Hold", &Base::RequestHold,
                                                      &Self::HoldCall);
  UnaryCallOf<v1::ReleaseRequest, v1::ReleaseResponse>::Ask(
      this, cq, "Release", &Base::RequestRelease, &Self::ReleaseCall);
  UnaryCallOf<v1::ListHoldingsRequest, v1::ListHoldingsResponse>::Ask(
      this, cq, "ListHoldings", &Base::RequestListHoldings, &Self::ListHoldingsCall);
  UnaryCallOf<v1::GetWorkloadRequest, v1::WorkloadResponse>::Ask(
      this, cq, "GetWorkload", &Base::RequestGetWorkload, &Self::GetWorkloadCall);
  UnaryCallOf<v1::PlacePodRequest, v1::Holding>::Ask(this, place_.cq.get(), "PlacePod",
                                                     &Base::RequestPlacePod, &Self::PlacePodCall);
  WatchCall::Ask(this);
}

void LedgerService::StopCallThreads() {
  {
    absl::MutexLock lock(&calls_mu_);
    if (calls_.cq == nullptr || calls_stopping_) return;
    calls_stopping_ = true;
    calls_.cq->Shutdown();
    place_.cq->Shutdown();
  }
  // Each thread returns once its queue is drained: the server's Shutdown
  // gave back every call still asked for.
  for (CallQueue* q : {&calls_, &place_}) {
    for (std::thread& t : q->threads) t.join();
    q->threads.clear();
    void* tag = nullptr;
    bool ok = false;
    while (q->cq->Next(&tag, &ok)) static_cast<CallTag*>(tag)->Proceed(false);
  }
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

void LedgerService::Answer(const UnaryCall& call, const absl::Status& status) {
  if (metrics_ != nullptr) {
    metrics_->ObserveRpc(call.method, status.code(),
                         absl::ToDoubleSeconds(absl::Now() - call.start));
  }
  call.finish(ToGrpc(status));
}

void LedgerService::Refuse(const UnaryCall& call, const absl::Status& status) {
  if (metrics_ != nullptr) metrics_->CountRefusal(status.code());
  Answer(call, status);
}

void LedgerService::AnswerWhenDurable(const UnaryCall& call, uint64_t seq,
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

void LedgerService::ListNodesCall(const UnaryCall& call, const grpc::ServerContextBase&,
                                  const v1::ListNodesRequest* req, v1::ListNodesResponse* resp) {
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

void LedgerService::GetNodeCall(const UnaryCall& call, const grpc::ServerContextBase&,
                                const v1::GetNodeRequest* req, v1::Node* resp) {
  if (absl::Status v = CheckNodeName("name", req->name()); !v.ok()) return Answer(call, v);
  auto view = ledger_->GetNode(req->name());
  if (view == nullptr) return Answer(call, UnknownNodeError(req->name()));
  NodeToProto(*view, resp);
  return Answer(call, absl::OkStatus());
}

void LedgerService::HoldCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                             const v1::HoldRequest* req, v1::HoldResponse* resp) {
  if (!serving()) return Refuse(call, NotGrantingError());
  if (absl::Status v = CheckHoldSelection(*req); !v.ok()) return Refuse(call, v);
  absl::StatusOr<HoldRequest> request = FromProto(*req);
  if (!request.ok()) return Refuse(call, request.status());
  // Before the authorizer (which may ask the API server about the pod) and
  // the ledger (which journals what it grants and echoes names in errors).
  if (absl::Status v = CheckOwnerStrings(request->owner); !v.ok()) return Refuse(call, v);
  if (absl::Status v = CheckNodeFor(request->owner, request->node); !v.ok()) {
    return Refuse(call, v);
  }
  std::string who;
  if (absl::Status a = AuthorizeCall(ctx, call.method, request->node, request->owner,
                                     slurm_munge::BindingOf(*req), &who);
      !a.ok()) {
    return Refuse(call, a);
  }
  absl::StatusOr<HoldResult> result = ledger_->Hold(*request);
  const bool slurm_conflict = !result.ok() && absl::IsResourceExhausted(result.status()) &&
                              request->owner.holder_class() == HolderClass::kSlurm;
  if (slurm_conflict && options_.pod_eviction_wait) {
    // A preemptor's step asking again while its devices' pod is evicted.
    if (std::optional<absl::Status> wait = options_.pod_eviction_wait(*request, false)) {
      return Refuse(call, *wait);
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
      return Refuse(call, *wait);
    }
  }
  if (!result.ok()) {
    if (metrics_ != nullptr && absl::IsResourceExhausted(result.status())) {
      if (std::optional<HolderClass> c = BlockingClass(*request)) metrics_->CountConflict(*c);
    }
    return Refuse(call, result.status());
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
    return Answer(call, WithReason(absl::UnavailableError("duet-bridge is not serving"),
                                   v1::reason::kNotServing));
  }
  absl::StatusOr<Owner> owner = FromProto(req->owner());
  if (!owner.ok()) return Answer(call, owner.status());
  if (absl::Status v = CheckOwnerStrings(*owner); !v.ok()) return Answer(call, v);
  if (absl::Status v = CheckNodeFor(*owner, req->node()); !v.ok()) return Answer(call, v);
  std::string who;
  if (absl::Status a =
          AuthorizeCall(ctx, call.method, req->node(), *owner, slurm_munge::BindingOf(*req), &who);
      !a.ok()) {
    return Answer(call, a);
  }
  absl::StatusOr<ReleaseResult> result = ledger_->Release(req->node(), *owner);
  if (!result.ok()) return Answer(call, result.status());
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

void LedgerService::ListHoldingsCall(const UnaryCall& call, const grpc::ServerContextBase&,
                                     const v1::ListHoldingsRequest* req,
                                     v1::ListHoldingsResponse* resp) {
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

void LedgerService::GetWorkloadCall(const UnaryCall& call, const grpc::ServerContextBase&,
                                    const v1::GetWorkloadRequest*, v1::WorkloadResponse* resp) {
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

// ---------------------------------------------------------------------------
// PlacePod: a placeholder made on the spot for a pod that bypassed the duet
// scheduler (asked by duet-node from Allocate).

void LedgerService::PlacePodCall(const UnaryCall& call, const grpc::ServerContextBase& ctx,
                                 const v1::PlacePodRequest* req, v1::Holding* resp) {
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
  if (absl::Status a = AuthorizeCall(ctx, call.method, req->node(), pod, std::nullopt, &who);
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
