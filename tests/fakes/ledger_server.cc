#include "tests/fakes/ledger_server.h"

#include <utility>

namespace duet {
namespace fakes {

LedgerServer::LedgerServer(Ledger* ledger, const std::string& address,
                           LedgerService::Options options)
    : ledger_(ledger) {
  ledger_->AddListener(&hub_);
  service_ = std::make_unique<LedgerService>(ledger_, durability_.get(), &hub_, nullptr,
                                             std::move(options));
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
}

LedgerServer::~LedgerServer() {
  hub_.CloseAll("test server stopping");
  if (server_ != nullptr) server_->Shutdown();
  ledger_->RemoveListener(&hub_);
}

}  // namespace fakes
}  // namespace duet
