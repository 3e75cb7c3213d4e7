// Fuzzes duet-bridge's gRPC service (bridge/server/service.h, LedgerService)
// end to end in one process: the first byte picks a duet.v1.Ledger method,
// the rest is decoded as its request message and sent over an in-process
// channel to the real handlers, over a small ledger (no network, no
// journal: durability is immediate). Checks beyond "no crash, no sanitizer
// report":
//   - every answer's code is one the API documents (proto/README.md);
//     INVALID_ARGUMENT carries no reason;
//   - no error message carries a control character (bad input is quoted
//     escaped, bounded) and none is longer than the longest legitimate one;
//   - ListNodes answers at most one node per ledger node (no amplification);
//   - whatever was granted has pod fields and (for pods) a node in
//     Kubernetes' characters and lengths, any node bounded and printable, and
//     the ledger passes CheckInvariants.
// Holdings are released after each input so that inputs do not depend on
// the ones before.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "bridge/ledger/ledger.h"
#include "bridge/server/durability.h"
#include "bridge/server/service.h"
#include "grpcpp/server_builder.h"
#include "proto/duet/v1/error_reason.h"

namespace duet {
namespace {


// A bridge's error message: the ledger's own (names, owners, devices) is a
// few hundred bytes at most; anything near this bound echoes input.
constexpr size_t kMaxMessage = 2048;

struct Env {
  Ledger ledger;
  std::unique_ptr<Durability> durability = NewImmediateDurability();
  WatchHub hub;
  std::unique_ptr<LedgerService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Ledger::Stub> stub;

  Env() {
    for (const char* name : {"gke-a", "gke-b", "Slurm_N1"}) {
      NodeSpec n;
      n.name = name;
      n.cpus = 16;
      n.memory_mib = 65536;
      for (uint32_t i = 0; i < 4; ++i) {
        DeviceSpec d;
        d.kind = i < 2 ? DeviceKind::kGpu : DeviceKind::kTpu;
        d.index = i % 2;
        n.devices.push_back(d);
      }
      if (!ledger.UpsertNode(n).ok()) std::abort();
    }
    ledger.AddListener(&hub);
    LedgerService::Options o;
    o.max_watch_streams = 8;
    o.max_watch_streams_per_caller = 4;
    service = std::make_unique<LedgerService>(&ledger, durability.get(), &hub, nullptr, o);
    grpc::ServerBuilder builder;
    service->RegisterWith(&builder);
    server = builder.BuildAndStart();
    if (server != nullptr) service->StartCallThreads();
    if (server == nullptr) std::abort();
    stub = v1::Ledger::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  }
};

Env& TheEnv() {
  static Env* env = new Env();  // never destroyed: gRPC threads outlive main's return
  return *env;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckAnswer(const grpc::Status& s) {
  using C = grpc::StatusCode;
  switch (s.error_code()) {
    case C::OK: case C::INVALID_ARGUMENT: case C::NOT_FOUND: case C::ALREADY_EXISTS:
    case C::RESOURCE_EXHAUSTED: case C::FAILED_PRECONDITION: case C::ABORTED:
    case C::UNAVAILABLE: case C::CANCELLED:
      break;
    default:
      std::abort();
  }
  if (s.error_code() == C::INVALID_ARGUMENT) Check(v1::ReasonOf(s).empty());
  Check(s.error_message().size() <= kMaxMessage);
  for (char c : s.error_message()) Check(!(c >= 0 && c < 0x20) && c != 0x7f);
}

// Up to `max` bytes from `allowed` (written out here rather than calling
// bridge/api/validate.h, so that the check does not share the code it checks).
bool Only(const std::string& s, size_t max, bool (*allowed)(char)) {
  if (s.size() > max) return false;
  for (char c : s) {
    if (!allowed(c)) return false;
  }
  return true;
}
bool Printable(char c) { return c > 0x20 && c < 0x7f; }
bool KubeName(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

// What the ledger now holds was checked on the way in.
void CheckLedger(Ledger& ledger) {
  Check(ledger.CheckInvariants().ok());
  for (const Holding& h : ledger.ListHoldings("")) {
    Check(!h.node.empty() && Only(h.node, 253, Printable));
    Check(Only(h.owner.pod_uid, 128, Printable));
    Check(Only(h.owner.pod_namespace, 63, KubeName));
    Check(Only(h.owner.pod_name, 253, KubeName));
    if (h.owner.holder_class() == HolderClass::kPod) Check(Only(h.node, 253, KubeName));
  }
}

template <typename Request>
bool Decode(const uint8_t* data, size_t size, Request* out) {
  return out->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace
}  // namespace duet

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;  // NOLINT: the whole target is about duet's types
  if (size == 0) return 0;
  Env& env = TheEnv();
  const uint8_t method = data[0] % 7;
  ++data;
  --size;
  grpc::ClientContext ctx;
  grpc::Status s;
  switch (method) {
    case 0: {
      v1::ListNodesRequest req;
      if (!Decode(data, size, &req)) return 0;
      v1::ListNodesResponse resp;
      s = env.stub->ListNodes(&ctx, req, &resp);
      Check(static_cast<size_t>(resp.nodes_size()) <= env.ledger.Snapshot().nodes.size());
      break;
    }
    case 1: {
      v1::GetNodeRequest req;
      if (!Decode(data, size, &req)) return 0;
      v1::Node resp;
      s = env.stub->GetNode(&ctx, req, &resp);
      break;
    }
    case 2: {
      v1::HoldRequest req;
      if (!Decode(data, size, &req)) return 0;
      v1::HoldResponse resp;
      s = env.stub->Hold(&ctx, req, &resp);
      break;
    }
    case 3: {
      v1::ReleaseRequest req;
      if (!Decode(data, size, &req)) return 0;
      v1::ReleaseResponse resp;
      s = env.stub->Release(&ctx, req, &resp);
      break;
    }
    case 4: {
      v1::ListHoldingsRequest req;
      if (!Decode(data, size, &req)) return 0;
      v1::ListHoldingsResponse resp;
      s = env.stub->ListHoldings(&ctx, req, &resp);
      break;
    }
    case 5: {
      v1::WatchNodesRequest req;
      if (!Decode(data, size, &req)) return 0;
      // An accepted stream sends one TYPE_INITIAL per watched node (every
      // node, or each name once), then waits for changes: read those, then
      // hang up. A refused one ends at once. The deadline only turns a hang
      // into a finding (DEADLINE_EXCEEDED aborts below).
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      const size_t initial = req.names().empty() ? env.ledger.Snapshot().nodes.size()
                                                 : static_cast<size_t>(req.names_size());
      std::unique_ptr<grpc::ClientReader<v1::NodeEvent>> reader = env.stub->WatchNodes(&ctx, req);
      v1::NodeEvent ev;
      size_t events = 0;
      while (events < initial && reader->Read(&ev)) {
        Check(ev.type() == v1::NodeEvent::TYPE_INITIAL);
        ++events;
      }
      if (events > 0) ctx.TryCancel();
      s = reader->Finish();
      break;
    }
    case 6: {
      v1::PlacePodRequest req;
      if (!Decode(data, size, &req)) return 0;
      v1::Holding resp;
      s = env.stub->PlacePod(&ctx, req, &resp);
      break;
    }
  }
  CheckAnswer(s);
  CheckLedger(env.ledger);
  for (const Holding& h : env.ledger.ListHoldings("")) (void)env.ledger.Release(h.node, h.owner);
  return 0;
}
