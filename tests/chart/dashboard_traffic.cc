// Hold/Release traffic for the dashboard test (dashboard_test.py): a few gRPC
// calls on a duet-bridge running its embedded demo inventory, so that the
// counters and histograms the dashboard's panels query have series. Each call
// must end with the status written next to it; exit 1 otherwise.
//   dashboard_traffic GRPC_TARGET   (e.g. unix:///tmp/x/bridge.sock)

#include <cstdio>
#include <string>

#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/create_channel.h"

namespace {

using duet::v1::HoldRequest;
using duet::v1::ReleaseRequest;

HoldRequest PodCount(const std::string& node, const std::string& uid, uint32_t count) {
  HoldRequest r;
  r.set_node(node);
  auto* pod = r.mutable_owner()->mutable_pod();
  pod->set_uid(uid);
  pod->set_namespace_("ml");
  pod->set_name(uid);
  r.mutable_count()->set_kind(duet::v1::DEVICE_KIND_GPU);
  r.mutable_count()->set_count(count);
  return r;
}

HoldRequest JobAll(const std::string& node, uint32_t job) {
  HoldRequest r;
  r.set_node(node);
  r.mutable_owner()->mutable_slurm_job()->set_job_id(job);
  for (uint32_t i = 0; i < 8; ++i) {
    auto* d = r.mutable_devices()->add_devices();
    d->set_kind(duet::v1::DEVICE_KIND_GPU);
    d->set_index(i);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dashboard_traffic GRPC_TARGET\n");
    return 2;
  }
  auto stub = duet::v1::Ledger::NewStub(
      grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  int failures = 0;
  auto check = [&](const char* what, const grpc::Status& s, grpc::StatusCode want) {
    std::printf("%-48s %d %s\n", what, s.error_code(), s.error_message().c_str());
    if (s.error_code() != want) ++failures;
  };
  auto hold = [&](const char* what, const HoldRequest& r, grpc::StatusCode want) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    duet::v1::HoldResponse resp;
    check(what, stub->Hold(&ctx, r, &resp), want);
  };
  auto release = [&](const char* what, const HoldRequest& r, grpc::StatusCode want) {
    ReleaseRequest rr;
    rr.set_node(r.node());
    *rr.mutable_owner() = r.owner();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    duet::v1::ReleaseResponse resp;
    check(what, stub->Release(&ctx, rr, &resp), want);
  };

  const HoldRequest pod = PodCount("gke-h100-a", "pod-a", 2);
  hold("pod holds 2 GPUs", pod, grpc::StatusCode::OK);
  hold("pod holds 3 GPUs on the other node", PodCount("gke-h100-b", "pod-b", 3),
       grpc::StatusCode::OK);
  // A Slurm job asking all 8 GPUs of the node where the pod holds 2: the
  // conflict the dashboard counts.
  hold("job asks all 8 GPUs under the pod: refused", JobAll("gke-h100-a", 7),
       grpc::StatusCode::RESOURCE_EXHAUSTED);
  hold("unknown node: refused", PodCount("no-such-node", "pod-c", 1),
       grpc::StatusCode::NOT_FOUND);
  release("pod releases", pod, grpc::StatusCode::OK);
  hold("job takes the 8 GPUs now free", JobAll("gke-h100-a", 7), grpc::StatusCode::OK);
  return failures == 0 ? 0 : 1;
}
