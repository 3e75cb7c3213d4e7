#include "tests/fakes/ledger_server.h"

#include <utility>

namespace duet {
namespace fakes {

LedgerServer::LedgerServer(Ledger* ledger, const std::string& address,
                           LedgerService::Options options)
    : ledger_(ledger), metrics_(std::make_unique<Metrics>(ledger)) {
  ledger_->AddListener(&hub_);
  service_ = std::make_unique<LedgerService>(ledger_, durability_.get(), &hub_, metrics_.get(),
                                             std::move(options));
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  service_->RegisterWith(&b);
  server_ = b.BuildAndStart();
  if (server_ != nullptr) service_->StartCallThreads();
}

LedgerServer::LedgerServer(const std::string& address, Standby standby)
    : ledger_(nullptr), standby_(std::make_unique<StandbyLedger>(std::move(standby.message))) {
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(standby_.get());
  server_ = b.BuildAndStart();
}

LedgerServer::~LedgerServer() {
  hub_.CloseAll("test server stopping");
  if (server_ != nullptr) server_->Shutdown();
  if (service_ != nullptr) service_->StopCallThreads();
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
