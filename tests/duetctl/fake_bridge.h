#pragma once

// An in-process duet-bridge for duetctl's tests: the generated
// duet::v1::Ledger::Service over a real duet::Ledger, listening on
// 127.0.0.1 on a port the OS picks. Not the real daemon (bridge/server is),
// but it answers with the same conversions (bridge/api/convert.h) and the
// same canonical codes, so duetctl sees what it will see in production.

#include <memory>
#include <string>

#include "bridge/ledger/ledger.h"
#include "grpcpp/grpcpp.h"

namespace duet::testing {

class FakeBridge {
 public:
  // Starts serving. `options` configures the ledger (e.g. a fake clock).
  explicit FakeBridge(Ledger::Options options = {});
  ~FakeBridge();
  FakeBridge(const FakeBridge&) = delete;
  FakeBridge& operator=(const FakeBridge&) = delete;

  Ledger& ledger() { return ledger_; }
  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }

  // Like duet-bridge (the default), ListNodes, WatchNodes and ListHoldings
  // answer NOT_FOUND for a name that is not in the ledger; with false they
  // leave unknown names out (the other reading of duet.proto).
  void set_refuse_unknown_names(bool refuse);

  // As a standby replica: ListNodes and GetNode answer UNAVAILABLE with
  // reason STANDBY (and a message worded unlike duet-bridge's).
  void set_standby(bool standby);

  // Ends every open WatchNodes stream with `code` (OK: as a server that ends
  // the stream on purpose; UNAVAILABLE: as duet-bridge shutting down does).
  void EndWatches(grpc::StatusCode code = grpc::StatusCode::OK);
  // Number of WatchNodes streams being served right now.
  int open_watches() const;

 private:
  class Service;

  Ledger ledger_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace duet::testing
