#pragma once

// The ledger API a standby replica serves (duet-bridge under
// kubernetes.leader_election before it wins the lease): every call, the
// WatchNodes stream included, is refused with UNAVAILABLE and reason STANDBY
// (what clients retry, and what the SPANK plugin's failure policy treats as
// "bridge unreachable"); nothing is granted or read.

#include <string>

#include "duet/v1/duet.grpc.pb.h"

namespace duet {

// duet-bridge's own standby message.
inline constexpr char kStandbyMessage[] =
    "duet-bridge standby: not the leader (the leader replica serves the ledger; retry)";

class StandbyLedger final : public v1::Ledger::CallbackService {
 public:
  explicit StandbyLedger(std::string message = kStandbyMessage);

  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx, const v1::ListNodesRequest*,
                                      v1::ListNodesResponse*) override;
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* ctx, const v1::GetNodeRequest*,
                                    v1::Node*) override;
  grpc::ServerUnaryReactor* Hold(grpc::CallbackServerContext* ctx, const v1::HoldRequest*,
                                 v1::HoldResponse*) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest*,
                                    v1::ReleaseResponse*) override;
  grpc::ServerUnaryReactor* ListHoldings(grpc::CallbackServerContext* ctx,
                                         const v1::ListHoldingsRequest*,
                                         v1::ListHoldingsResponse*) override;
  grpc::ServerUnaryReactor* PlacePod(grpc::CallbackServerContext* ctx, const v1::PlacePodRequest*,
                                     v1::Holding*) override;
  grpc::ServerUnaryReactor* GetWorkload(grpc::CallbackServerContext* ctx,
                                        const v1::GetWorkloadRequest*,
                                        v1::WorkloadResponse*) override;
  grpc::ServerWriteReactor<v1::NodeEvent>* WatchNodes(grpc::CallbackServerContext* ctx,
                                                      const v1::WatchNodesRequest*) override;

 private:
  grpc::Status Status() const;
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx) const;

  const std::string message_;
};

}  // namespace duet
