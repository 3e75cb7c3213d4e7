#include "tests/duetctl/fake_bridge.h"

#include <atomic>
#include <deque>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/api/convert.h"
#include "common/reason.h"
#include "duet/v1/duet.grpc.pb.h"
#include "google/protobuf/util/time_util.h"

namespace duet::testing {
namespace {

// Queues the ledger's changes for one watch stream.
class ChangeQueue final : public ChangeListener {
 public:
  struct Item {
    std::shared_ptr<const NodeView> view;
    bool erased = false;
  };

  void OnChange(const Change& change) override {
    absl::MutexLock lock(&mu_);
    items_.push_back({*change.view, change.erased});
  }

  // Waits up to `timeout` for changes and takes them all.
  std::deque<Item> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [](std::deque<Item>* q) { return !q->empty(); };
    mu_.AwaitWithTimeout(absl::Condition(+ready, &items_), timeout);
    return std::exchange(items_, {});
  }

 private:
  absl::Mutex mu_;
  std::deque<Item> items_;
};

}  // namespace

class FakeBridge::Service final : public v1::Ledger::Service {
 public:
  explicit Service(Ledger* ledger) : ledger_(ledger) {}

  void EndWatches(grpc::StatusCode code) {
    end_code_ = code;
    end_watches_ = true;
  }
  void set_refuse_unknown_names(bool refuse) { refuse_unknown_names_ = refuse; }
  void set_standby(bool standby) { standby_ = standby; }
  int open_watches() const { return open_watches_; }

  grpc::Status ListNodes(grpc::ServerContext*, const v1::ListNodesRequest* request,
                         v1::ListNodesResponse* response) override {
    if (standby_) return Standby();
    std::set<std::string> names(request->names().begin(), request->names().end());
    if (grpc::Status s = CheckNames(names); !s.ok()) return s;
    for (const auto& view : ledger_->Snapshot().nodes) {
      if (names.empty() || names.count(view->spec.name) > 0) {
        ToProto(*view, response->add_nodes());
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status GetNode(grpc::ServerContext*, const v1::GetNodeRequest* request,
                       v1::Node* response) override {
    if (standby_) return Standby();
    auto view = ledger_->GetNode(request->name());
    if (view == nullptr) return ToGrpc(UnknownNodeError(request->name()));
    ToProto(*view, response);
    return grpc::Status::OK;
  }

  grpc::Status Hold(grpc::ServerContext*, const v1::HoldRequest* request,
                    v1::HoldResponse* response) override {
    auto req = FromProto(*request);
    if (!req.ok()) return ToGrpc(req.status());
    auto result = ledger_->Hold(*req);
    if (!result.ok()) return ToGrpc(result.status());
    auto view = ledger_->GetNode(request->node());
    ToProto(result->holding, view.get(), response->mutable_holding());
    response->set_created(result->created);
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override {
    auto owner = FromProto(request->owner());
    if (!owner.ok()) return ToGrpc(owner.status());
    auto result = ledger_->Release(request->node(), *owner);
    if (!result.ok()) return ToGrpc(result.status());
    response->set_released(result->released);
    if (result->released) ToProto(result->holding, response->mutable_holding());
    return grpc::Status::OK;
  }

  grpc::Status ListHoldings(grpc::ServerContext*, const v1::ListHoldingsRequest* request,
                            v1::ListHoldingsResponse* response) override {
    if (!request->node().empty()) {
      if (grpc::Status s = CheckNames({request->node()}); !s.ok()) return s;
    }
    for (const Holding& h : ledger_->ListHoldings(request->node())) {
      auto view = ledger_->GetNode(h.node);
      ToProto(h, view.get(), response->add_holdings());
    }
    return grpc::Status::OK;
  }

  grpc::Status WatchNodes(grpc::ServerContext* context, const v1::WatchNodesRequest* request,
                          grpc::ServerWriter<v1::NodeEvent>* writer) override {
    ++open_watches_;
    struct Close {
      std::atomic<int>* n;
      ~Close() { --*n; }
    } close{&open_watches_};
    std::set<std::string> names(request->names().begin(), request->names().end());
    if (grpc::Status s = CheckNames(names); !s.ok()) return s;
    auto wanted = [&](const std::string& n) { return names.empty() || names.count(n) > 0; };
    auto send = [&](v1::NodeEvent::Type type, const NodeView& view) {
      v1::NodeEvent event;
      event.set_type(type);
      ToProto(view, event.mutable_node());
      *event.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
      return writer->Write(event);
    };

    // Listen first, then snapshot: a change in between is sent twice
    // (INITIAL, then UPDATED), never lost.
    ChangeQueue queue;
    ledger_->AddListener(&queue);
    struct Unlisten {
      Ledger* ledger;
      ChangeQueue* queue;
      ~Unlisten() { ledger->RemoveListener(queue); }
    } unlisten{ledger_, &queue};

    for (const auto& view : ledger_->Snapshot().nodes) {
      if (wanted(view->spec.name) && !send(v1::NodeEvent::TYPE_INITIAL, *view)) {
        return grpc::Status::OK;
      }
    }
    while (!context->IsCancelled() && !end_watches_) {
      for (const auto& item : queue.Take(absl::Milliseconds(20))) {
        if (!wanted(item.view->spec.name)) continue;
        const auto type =
            item.erased ? v1::NodeEvent::TYPE_REMOVED : v1::NodeEvent::TYPE_UPDATED;
        if (!send(type, *item.view)) return grpc::Status::OK;
      }
    }
    if (end_watches_ && end_code_ != grpc::StatusCode::OK) {
      return grpc::Status(end_code_, "duet-bridge is shutting down");
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status CheckNames(const std::set<std::string>& names) const {
    if (!refuse_unknown_names_) return grpc::Status::OK;
    for (const auto& n : names) {
      if (ledger_->GetNode(n) == nullptr) {
        return ToGrpc(UnknownNodeError(n));
      }
    }
    return grpc::Status::OK;
  }

  // A standby's answer, worded unlike duet-bridge's own: the client must
  // recognise it by its reason, not its text.
  static grpc::Status Standby() {
    return ToGrpc(WithReason(absl::UnavailableError("this replica follows; ask the leader"),
                             v1::reason::kStandby));
  }

  Ledger* const ledger_;
  std::atomic<bool> standby_{false};
  std::atomic<bool> refuse_unknown_names_{true};
  std::atomic<bool> end_watches_{false};
  std::atomic<grpc::StatusCode> end_code_{grpc::StatusCode::OK};
  std::atomic<int> open_watches_{0};
};

FakeBridge::FakeBridge(Ledger::Options options)
    : ledger_(options), service_(std::make_unique<Service>(&ledger_)) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  address_ = absl::StrCat("127.0.0.1:", port);
}

FakeBridge::~FakeBridge() {
  service_->EndWatches(grpc::StatusCode::OK);
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
}

void FakeBridge::EndWatches(grpc::StatusCode code) { service_->EndWatches(code); }

void FakeBridge::set_standby(bool standby) { service_->set_standby(standby); }

void FakeBridge::set_refuse_unknown_names(bool refuse) {
  service_->set_refuse_unknown_names(refuse);
}

int FakeBridge::open_watches() const { return service_->open_watches(); }

}  // namespace duet::testing
