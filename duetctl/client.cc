#include "duetctl/client.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/tls.h"
#include "proto/duet/v1/error_reason.h"

namespace duet::ctl {
namespace {

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

std::string ChannelTarget(const std::string& server) {
  if (absl::StartsWith(server, "/")) return absl::StrCat("unix://", server);
  return server;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options) {
  if (options.server.empty()) {
    return absl::InvalidArgumentError("--server: must not be empty");
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--cert-file and --key-file: give both for a client certificate, or neither");
  }
  if (options.ca_file.empty() && !options.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--cert-file/--key-file need --ca-file: TLS is used only when --ca-file is given");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.ca_file.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    auto tls = TlsChannelCredentials({options.ca_file, "--ca-file"},
                                     {options.cert_file, "--cert-file"},
                                     {options.key_file, "--key-file"},
                                     absl::StatusCode::kInvalidArgument);
    if (!tls.ok()) return tls.status();
    creds = *std::move(tls);
  }
  grpc::ChannelArguments args;
  // ListNodes of a large cluster is bigger than gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(-1);
  return grpc::CreateCustomChannel(ChannelTarget(options.server), creds, args);
}

absl::Status ExplainRpcError(const grpc::Status& status, const ClientOptions& options,
                             const std::string& method, const std::string& node) {
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  const std::string detail =
      status.error_message().empty() ? CodeName(status.error_code()) : status.error_message();
  const std::string& server = options.server;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: {
      if (v1::ReasonOf(status) == v1::reason::kStandby) {
        return absl::Status(code, absl::StrCat("duet-bridge at ", server, " is a standby replica (",
                                               detail, "). Point --server or ", kServerEnv,
                                               " at the leader, e.g. the bridge's Service."));
      }
      std::string msg = absl::StrCat("cannot reach duet-bridge at ", server, ": ", detail,
                                     ". Is it running? Set --server or ", kServerEnv, ".");
      if (!options.ca_file.empty()) {
        absl::StrAppend(&msg, " If it is running, check --ca-file, --cert-file and --key-file.");
      }
      return absl::Status(code, msg);
    }
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::Status(
          code, absl::StrCat("duet-bridge at ", server, " did not answer ", method, " within ",
                             absl::FormatDuration(options.timeout), ". Is ", server,
                             " the right address? Raise --timeout or set --server."));
    case grpc::StatusCode::NOT_FOUND:
      if (!node.empty() && v1::ReasonOf(status) == v1::reason::kNodeNotShared) {
        return absl::Status(code,
                            absl::StrCat("no node named ", node, " (duetctl nodes lists them)"));
      }
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::Status(code, absl::StrCat("duet-bridge at ", server, " refused ", method, ": ",
                                             detail,
                                             ". Check --ca-file, --cert-file and --key-file."));
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::Status(code, absl::StrCat("the server at ", server, " does not serve ",
                                             method, ": ", detail, ". Is ", server,
                                             " a duet-bridge as new as this duetctl?"));
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(method, " at ", server, " failed: ",
                                         CodeName(status.error_code()), ": ", detail));
}

// ---------------------------------------------------------------------------
// NodeWatch
// ---------------------------------------------------------------------------

class NodeWatch::Reactor final : public grpc::ClientReadReactor<v1::NodeEvent> {
 public:
  Reactor(NodeWatch* watch, ClientOptions options) : watch_(watch), options_(std::move(options)) {}

  void Start(v1::Ledger::Stub* stub, v1::WatchNodesRequest request) {
    request_ = std::move(request);
    if (request_.names_size() == 1) node_ = request_.names(0);
    stub->async()->WatchNodes(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows.
    received_any_ = true;
    {
      absl::MutexLock lock(&watch_->mu_);
      watch_->events_.push_back(std::move(event_));
    }
    event_.Clear();
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&watch_->mu_);
    watch_->done_ = true;
    if (status.ok() || (watch_->cancelled_ && status.error_code() == grpc::StatusCode::CANCELLED)) {
      watch_->status_ = absl::OkStatus();
    } else if (received_any_ && status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      // It was reachable: say that the connection was lost, not that it
      // never answered.
      watch_->status_ = absl::UnavailableError(
          absl::StrCat("lost duet-bridge at ", options_.server, ": ", status.error_message(),
                       ". Run the command again once it is back."));
    } else {
      watch_->status_ = ExplainRpcError(status, options_, "WatchNodes", node_);
    }
  }

 private:
  NodeWatch* const watch_;
  const ClientOptions options_;
  grpc::ClientContext context_;
  v1::WatchNodesRequest request_;
  v1::NodeEvent event_;
  std::string node_;           // the one watched node, for NOT_FOUND messages
  bool received_any_ = false;  // only touched by OnReadDone and OnDone, in order
};

NodeWatch::~NodeWatch() {
  if (reactor_ == nullptr) return;
  Cancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
}

NodeWatch::Result NodeWatch::Next(absl::Duration timeout, v1::NodeEvent* event) {
  absl::MutexLock lock(&mu_);
  auto ready = [](NodeWatch* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !w->events_.empty() || w->done_;
  };
  mu_.AwaitWithTimeout(absl::Condition(+ready, this), timeout);
  if (!events_.empty()) {
    *event = std::move(events_.front());
    events_.pop_front();
    return Result::kEvent;
  }
  return done_ ? Result::kDone : Result::kTimeout;
}

void NodeWatch::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    cancelled_ = true;
  }
  reactor_->Cancel();
}

absl::Status NodeWatch::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      stub_(v1::Ledger::NewStub(channel_)),
      options_(std::move(options)) {}

void Client::SetDeadline(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options_.timeout));
}

template <typename Request, typename Response>
absl::StatusOr<Response> Client::Call(
    grpc::Status (v1::Ledger::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, const std::string& method, const std::string& node) {
  Response response;
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Status s = (stub_.get()->*rpc)(&context, request, &response);
  if (!s.ok()) return ExplainRpcError(s, options_, method, node);
  return response;
}

absl::StatusOr<v1::ListNodesResponse> Client::ListNodes(const std::vector<std::string>& names) {
  v1::ListNodesRequest request;
  for (const auto& n : names) request.add_names(n);
  v1::ListNodesResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Status s = stub_->ListNodes(&context, request, &response);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND && names.size() > 1) {
    // A server that refuses the whole list for one unknown name: ask node by
    // node, so the caller can show what exists and name what does not.
    response.Clear();
    for (const auto& name : names) {
      auto node = GetNode(name);
      if (node.ok()) {
        *response.add_nodes() = *std::move(node);
      } else if (node.status().code() != absl::StatusCode::kNotFound) {
        return node.status();
      }
    }
    return response;
  }
  if (s.error_code() == grpc::StatusCode::NOT_FOUND && names.size() == 1) {
    response.Clear();
    return response;  // Unknown names are left out.
  }
  if (!s.ok()) return ExplainRpcError(s, options_, "ListNodes");
  return response;
}

absl::StatusOr<v1::Node> Client::GetNode(const std::string& name) {
  v1::GetNodeRequest request;
  request.set_name(name);
  return Call(&v1::Ledger::Stub::GetNode, request, "GetNode", name);
}

absl::StatusOr<v1::ListHoldingsResponse> Client::ListHoldings(const std::string& node) {
  v1::ListHoldingsRequest request;
  request.set_node(node);
  return Call(&v1::Ledger::Stub::ListHoldings, request, "ListHoldings", node);
}

absl::StatusOr<v1::WorkloadResponse> Client::GetWorkload() {
  return Call(&v1::Ledger::Stub::GetWorkload, v1::GetWorkloadRequest(), "GetWorkload", "");
}

std::unique_ptr<NodeWatch> Client::WatchNodes(const std::vector<std::string>& names) {
  std::unique_ptr<NodeWatch> watch(new NodeWatch());
  watch->reactor_ = std::make_unique<NodeWatch::Reactor>(watch.get(), options_);
  v1::WatchNodesRequest request;
  for (const auto& n : names) request.add_names(n);
  watch->reactor_->Start(stub_.get(), std::move(request));
  return watch;
}

}  // namespace duet::ctl
