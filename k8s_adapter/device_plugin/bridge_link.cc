#include "k8s_adapter/device_plugin/bridge_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/grpc/tls.h"
#include "grpcpp/create_channel.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace node {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> BridgeCredentials(
    const NodePluginOptions& o) {
  if (o.bridge_ca_file.empty() && o.bridge_cert_file.empty() && o.bridge_key_file.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  return TlsChannelCredentials({o.bridge_ca_file, "--bridge-ca"},
                               {o.bridge_cert_file, "--bridge-cert"},
                               {o.bridge_key_file, "--bridge-key"});
}

BridgeLink::BridgeLink(const NodePluginOptions& options,
                       std::shared_ptr<grpc::ChannelCredentials> credentials,
                       prometheus::Counter* watch_restarts, prometheus::Gauge* watch_connected)
    : options_(options),
      channel_(grpc::CreateChannel(options_.bridge, credentials)),
      stub_(v1::Ledger::NewStub(channel_)),
      watch_restarts_(watch_restarts),
      watch_connected_(watch_connected) {}

BridgeLink::~BridgeLink() { Stop(); }

void BridgeLink::AddBridgeToken(grpc::ClientContext* ctx) const {
  if (options_.bridge_token_file.empty()) return;
  absl::StatusOr<std::string> token = ReadFileToString(
      options_.bridge_token_file, absl::StatusCode::kNotFound, "--bridge-token-file");
  std::string t = token.ok() ? std::string(absl::StripAsciiWhitespace(*token)) : "";
  if (t.empty()) {
    // The bridge refuses the call with a reason that names the missing token.
    spdlog::warn("no bridge token to send: {}",
                 token.ok() ? "--bridge-token-file is empty" : token.status().ToString());
    return;
  }
  ctx->AddMetadata("authorization", absl::StrCat("Bearer ", t));
}

grpc::Status BridgeLink::ListHoldings(std::vector<v1::Holding>* holdings) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.bridge_timeout));
  AddBridgeToken(&ctx);
  v1::ListHoldingsRequest lreq;
  lreq.set_node(options_.node_name);
  v1::ListHoldingsResponse lresp;
  grpc::Status st = stub_->ListHoldings(&ctx, lreq, &lresp);
  if (st.ok()) holdings->assign(lresp.holdings().begin(), lresp.holdings().end());
  return st;
}

grpc::Status BridgeLink::PlacePod(const v1::PlacePodRequest& request, v1::Holding* placed) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.bridge_timeout));
  AddBridgeToken(&ctx);
  return stub_->PlacePod(&ctx, request, placed);
}

grpc::Status BridgeLink::ForwardStep(const StepCall& call) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + call.timeout));
  AddBridgeToken(&ctx);
  if (!call.credential_key.empty()) ctx.AddMetadata(call.credential_key, call.credential);
  if (call.hold) {
    v1::HoldResponse resp;
    return stub_->Hold(&ctx, call.hold_request, &resp);
  }
  v1::ReleaseResponse resp;
  return stub_->Release(&ctx, call.release_request, &resp);
}

void BridgeLink::StartWatch(NodeCallback on_node) {
  on_node_ = std::move(on_node);
  watch_thread_ = std::thread([this] { WatchLoop(); });
}

void BridgeLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (watch_ctx_ != nullptr) watch_ctx_->TryCancel();
    cv_.SignalAll();
  }
  if (watch_thread_.joinable()) watch_thread_.join();
}

void BridgeLink::WatchLoop() {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      watch_ctx_ = &ctx;
    }
    AddBridgeToken(&ctx);
    v1::WatchNodesRequest req;
    req.add_names(options_.node_name);
    std::unique_ptr<grpc::ClientReader<v1::NodeEvent>> reader = stub_->WatchNodes(&ctx, req);
    v1::NodeEvent ev;
    while (reader->Read(&ev)) {
      backoff = absl::Milliseconds(100);
      watch_connected_->Set(1);
      switch (ev.type()) {
        case v1::NodeEvent::TYPE_INITIAL:
        case v1::NodeEvent::TYPE_UPDATED:
          on_node_(&ev.node());
          break;
        case v1::NodeEvent::TYPE_REMOVED:
          // Nothing fences this node any more: the callback advertises every
          // slot Unhealthy.
          on_node_(nullptr);
          break;
        default:
          continue;  // RESYNC: full state follows
      }
    }
    const grpc::Status st = reader->Finish();
    watch_connected_->Set(0);
    absl::MutexLock lock(&mu_);
    watch_ctx_ = nullptr;
    if (stopping_) return;
    watch_restarts_->Increment();
    spdlog::warn("bridge {}: WatchNodes({}) ended: {} (retry in {})", options_.bridge,
                 options_.node_name, st.error_message(), absl::FormatDuration(backoff));
    cv_.WaitWithTimeout(&mu_, backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace node
}  // namespace duet
