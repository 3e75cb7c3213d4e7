#pragma once

// The real duet.v1.Ledger service (bridge/server's LedgerService, the one
// duet-bridge serves) over a test's own duet::Ledger, on immediate
// durability: what a client sees is what duet-bridge answers, refusal
// reasons included, without a journal or the daemon around it.
//
// Thread-safety: gRPC calls the service from its own threads; the ledger is
// thread-safe. Construct and destroy from one thread.

#include <memory>
#include <string>

#include "bridge/ledger/ledger.h"
#include "bridge/server/durability.h"
#include "bridge/server/service.h"
#include "grpcpp/grpcpp.h"

namespace duet {
namespace fakes {

class LedgerServer {
 public:
  // Serves `ledger` (not owned; must outlive this object) on `address`:
  // "unix:///path.sock", or "127.0.0.1:0" for a port the OS picks.
  LedgerServer(Ledger* ledger, const std::string& address,
               LedgerService::Options options = LedgerService::Options());
  ~LedgerServer();
  LedgerServer(const LedgerServer&) = delete;
  LedgerServer& operator=(const LedgerServer&) = delete;

  bool ok() const { return server_ != nullptr; }
  // The port picked for "host:0" (0 for a unix socket).
  int port() const { return port_; }
  LedgerService* service() { return service_.get(); }

 private:
  Ledger* const ledger_;
  std::unique_ptr<Durability> durability_ = NewImmediateDurability();
  WatchHub hub_;
  std::unique_ptr<LedgerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace fakes
}  // namespace duet
