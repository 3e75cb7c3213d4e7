#include "tests/fakes/ledger_server.h"

#include <utility>

#include "bridge/api/convert.h"
#include "common/reason.h"

namespace duet {
namespace fakes {

// What duet-bridge's standby serves (bridge/server/leadership.cc): every
// call refused, the stream included.
class LedgerServer::StandbyService final : public v1::Ledger::CallbackService {
 public:
  explicit StandbyService(std::string message) : message_(std::move(message)) {}

  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx, const v1::ListNodesRequest*,
                                      v1::ListNodesResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* ctx, const v1::GetNodeRequest*,
                                    v1::Node*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* Hold(grpc::CallbackServerContext* ctx, const v1::HoldRequest*,
                                 v1::HoldResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest*,
                                    v1::ReleaseResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* ListHoldings(grpc::CallbackServerContext* ctx,
                                         const v1::ListHoldingsRequest*,
                                         v1::ListHoldingsResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* PlacePod(grpc::CallbackServerContext* ctx, const v1::PlacePodRequest*,
                                     v1::Holding*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* GetWorkload(grpc::CallbackServerContext* ctx,
                                        const v1::GetWorkloadRequest*,
                                        v1::WorkloadResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerWriteReactor<v1::NodeEvent>* WatchNodes(grpc::CallbackServerContext*,
                                                      const v1::WatchNodesRequest*) override {
    class Refused final : public grpc::ServerWriteReactor<v1::NodeEvent> {
     public:
      explicit Refused(const grpc::Status& status) { Finish(status); }
      void OnDone() override { delete this; }
    };
    return new Refused(Status());
  }

 private:
  grpc::Status Status() const {
    return ToGrpc(WithReason(absl::UnavailableError(message_), v1::reason::kStandby));
  }
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx) const {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(Status());
    return r;
  }

  const std::string message_;
};

LedgerServer::LedgerServer(Ledger* ledger, const std::string& address,
                           LedgerService::Options options)
    : ledger_(ledger), metrics_(std::make_unique<Metrics>(ledger)) {
  ledger_->AddListener(&hub_);
  service_ = std::make_unique<LedgerService>(ledger_, durability_.get(), &hub_, metrics_.get(),
                                             std::move(options));
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
}

LedgerServer::LedgerServer(const std::string& address, Standby standby)
    : ledger_(nullptr), standby_(std::make_unique<StandbyService>(std::move(standby.message))) {
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(standby_.get());
  server_ = b.BuildAndStart();
}

LedgerServer::~LedgerServer() {
  hub_.CloseAll("test server stopping");
  if (server_ != nullptr) server_->Shutdown();
  if (ledger_ != nullptr) ledger_->RemoveListener(&hub_);
}

int LedgerServer::watch_streams() const {
  if (metrics_ == nullptr) return 0;
  for (const prometheus::MetricFamily& f : metrics_->registry()->Collect()) {
    if (f.name == "duet_watch_streams" && !f.metric.empty()) {
      return static_cast<int>(f.metric.front().gauge.value);
    }
  }
  return 0;
}

void LedgerServer::CloseWatches(const std::string& why) { hub_.CloseAll(why); }

}  // namespace fakes
}  // namespace duet
