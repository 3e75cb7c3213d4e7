#pragma once

// A thin duet.v1.Ledger gRPC service over a real in-process duet::Ledger, for
// the SPANK plugin's tests until duet-bridge's own server can be started from
// tests. Refusals go through the bridge's own ToGrpc, so they carry the same
// google.rpc.ErrorInfo reasons. Only the unary calls the plugin uses (Hold, Release, ListHoldings)
// and GetNode/ListNodes are served.
//
// Thread-safety: gRPC calls it from its own threads; duet::Ledger is
// thread-safe and the service holds no other state.

#include <memory>
#include <string>

#include "bridge/api/convert.h"
#include "common/reason.h"
#include "bridge/ledger/ledger.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace duet::testing {

class TestLedgerService final : public v1::Ledger::Service {
 public:
  explicit TestLedgerService(duet::Ledger* ledger) : ledger_(ledger) {}

  grpc::Status Hold(grpc::ServerContext*, const v1::HoldRequest* req,
                    v1::HoldResponse* resp) override {
    auto r = FromProto(*req);
    if (!r.ok()) return ToGrpc(r.status());
    auto held = ledger_->Hold(*r);
    if (!held.ok()) return ToGrpc(held.status());
    ToProto(held->holding, resp->mutable_holding());
    resp->set_created(held->created);
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse* resp) override {
    auto owner = FromProto(req->owner());
    if (!owner.ok()) return ToGrpc(owner.status());
    auto r = ledger_->Release(req->node(), *owner);
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_released(r->released);
    if (r->released) ToProto(r->holding, resp->mutable_holding());
    return grpc::Status::OK;
  }

  grpc::Status ListHoldings(grpc::ServerContext*, const v1::ListHoldingsRequest* req,
                            v1::ListHoldingsResponse* resp) override {
    for (const Holding& h : ledger_->ListHoldings(req->node())) {
      ToProto(h, resp->add_holdings());
    }
    return grpc::Status::OK;
  }

  grpc::Status GetNode(grpc::ServerContext*, const v1::GetNodeRequest* req,
                       v1::Node* resp) override {
    auto view = ledger_->GetNode(req->name());
    if (!view) return ToGrpc(UnknownNodeError(req->name()));
    ToProto(*view, resp);
    return grpc::Status::OK;
  }

 private:
  duet::Ledger* ledger_;
};

// Serves `ledger` on `address` (e.g. "unix:///tmp/x.sock") until destroyed.
class TestLedgerServer {
 public:
  TestLedgerServer(duet::Ledger* ledger, const std::string& address) : service_(ledger) {
    grpc::ServerBuilder b;
    b.AddListeningPort(address, grpc::InsecureServerCredentials());
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~TestLedgerServer() {
    if (server_) server_->Shutdown();
  }
  bool ok() const { return server_ != nullptr; }

 private:
  TestLedgerService service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace duet::testing
