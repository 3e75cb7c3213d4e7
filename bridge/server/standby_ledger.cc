#include "bridge/server/standby_ledger.h"

#include <utility>

#include "absl/status/status.h"
#include "common/grpc/status.h"
#include "common/reason.h"

namespace duet {

StandbyLedger::StandbyLedger(std::string message) : message_(std::move(message)) {}

grpc::Status StandbyLedger::Status() const {
  return ToGrpc(WithReason(absl::UnavailableError(message_), v1::reason::kStandby));
}

grpc::ServerUnaryReactor* StandbyLedger::Refuse(grpc::CallbackServerContext* ctx) const {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(Status());
  return r;
}

grpc::ServerUnaryReactor* StandbyLedger::ListNodes(grpc::CallbackServerContext* ctx,
                                                   const v1::ListNodesRequest*,
                                                   v1::ListNodesResponse*) {
  return Refuse(ctx);
}
grpc::ServerUnaryReactor* StandbyLedger::GetNode(grpc::CallbackServerContext* ctx,
                                                 const v1::GetNodeRequest*, v1::Node*) {
  return Refuse(ctx);
}
grpc::ServerUnaryReactor* StandbyLedger::Hold(grpc::CallbackServerContext* ctx,
                                              const v1::HoldRequest*, v1::HoldResponse*) {
  return Refuse(ctx);
}
grpc::ServerUnaryReactor* StandbyLedger::Release(grpc::CallbackServerContext* ctx,
                                                 const v1::ReleaseRequest*, v1::ReleaseResponse*) {
  return Refuse(ctx);
}
grpc::ServerUnaryReactor* StandbyLedger::ListHoldings(grpc::CallbackServerContext* ctx,
                                                      const v1::ListHoldingsRequest*,
                                                      v1::ListHoldingsResponse*) {
  return Refuse(ctx);
}
grpc::ServerUnaryReactor* StandbyLedger::PlacePod(grpc::CallbackServerContext* ctx,
                                                  const v1::PlacePodRequest*, v1::Holding*) {
  return Refuse(ctx);
}
grpc::ServerUnaryReactor* StandbyLedger::GetWorkload(grpc::CallbackServerContext* ctx,
                                                     const v1::GetWorkloadRequest*,
                                                     v1::WorkloadResponse*) {
  return Refuse(ctx);
}

grpc::ServerWriteReactor<v1::NodeEvent>* StandbyLedger::WatchNodes(grpc::CallbackServerContext*,
                                                                   const v1::WatchNodesRequest*) {
  class Refused final : public grpc::ServerWriteReactor<v1::NodeEvent> {
   public:
    explicit Refused(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  return new Refused(Status());
}

}  // namespace duet
