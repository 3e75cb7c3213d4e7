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
#include "bridge/server/metrics.h"
#include "bridge/server/service.h"
#include "bridge/server/standby_ledger.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace duet {
namespace fakes {

class LedgerServer {
 public:
  // A replica that does not hold the leader lease (duet-bridge under
  // kubernetes.leader_election before it wins): every Ledger call is
  // refused with UNAVAILABLE, reason STANDBY, and `message`; nothing is read
  // or granted. The default message is duet-bridge's own.
  struct Standby {
    std::string message = kStandbyMessage;
  };

  // Serves `ledger` (not owned; must outlive this object) on `address`:
  // "unix:///path.sock", or "127.0.0.1:0" for a port the OS picks.
  LedgerServer(Ledger* ledger, const std::string& address,
               LedgerService::Options options = LedgerService::Options());
  // Serves as a standby on `address` (no ledger).
  LedgerServer(const std::string& address, Standby standby);
  ~LedgerServer();
  LedgerServer(const LedgerServer&) = delete;
  LedgerServer& operator=(const LedgerServer&) = delete;

  bool ok() const { return server_ != nullptr; }
  // The port picked for "host:0" (0 for a unix socket).
  int port() const { return port_; }
  LedgerService* service() { return service_.get(); }

  // WatchNodes streams open now (duet-bridge's duet_watch_streams gauge):
  // counted from the call's arrival, before its initial state is sent.
  int watch_streams() const;
  // Ends every WatchNodes stream as duet-bridge does when it shuts down
  // (UNAVAILABLE, reason NOT_SERVING, `why`). New streams are still served.
  void CloseWatches(const std::string& why = "duet-bridge is shutting down");

 private:

  Ledger* const ledger_;
  std::unique_ptr<Durability> durability_ = NewImmediateDurability();
  WatchHub hub_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<LedgerService> service_;
  std::unique_ptr<StandbyLedger> standby_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace fakes
}  // namespace duet
