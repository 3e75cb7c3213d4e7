#include "slurm_plugin/bridge_client.h"

#include <munge.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/reason.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "common/grpc/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/duet/v1/error_reason.h"

namespace duet::spank {
namespace {

void SetOwner(uint32_t job_id, uint32_t step_id, v1::Owner* owner) {
  owner->mutable_slurm_step()->set_job_id(job_id);
  owner->mutable_slurm_step()->set_step_id(step_id);
}

std::string KindName(v1::DeviceKind k) {
  return k == v1::DEVICE_KIND_TPU ? "tpu" : k == v1::DEVICE_KIND_GPU ? "gpu" : "device";
}

std::string OwnerName(const v1::Owner& o) {
  switch (o.kind_case()) {
    case v1::Owner::kPod:
      return absl::StrCat("pod ", o.pod().namespace_(), "/", o.pod().name());
    case v1::Owner::kPlaceholder:
      return absl::StrCat("placeholder job ", o.placeholder().job_id(), " of pod uid ",
                          o.placeholder().pod_uid());
    case v1::Owner::kClaim:
      return absl::StrCat("resource claim ", o.claim().namespace_(), "/", o.claim().name(),
                          " (lend job ", o.claim().job_id(), ")");
    case v1::Owner::kLend:
      return absl::StrCat("lend job ", o.lend().job_id(), " (devices lent to kubernetes)");
    case v1::Owner::kGangSlot:
      return absl::StrCat("gang ", o.gang_slot().gang(), " slot ", o.gang_slot().slot(),
                          " (gang job ", o.gang_slot().job_id(), ", reserved for kubernetes)");
    case v1::Owner::kSlurmJob:
      return absl::StrCat("slurm job ", o.slurm_job().job_id());
    case v1::Owner::kSlurmStep:
      return absl::StrCat("slurm job ", o.slurm_step().job_id(), " step ",
                          o.slurm_step().step_id());
    default:
      return "unknown owner";
  }
}

uint32_t JobOf(const v1::Owner& o) {
  if (o.has_slurm_job()) return o.slurm_job().job_id();
  if (o.has_slurm_step()) return o.slurm_step().job_id();
  return 0;
}

}  // namespace

BridgeClient::BridgeClient(const std::string& target, int timeout_ms)
    : channel_(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
      stub_(v1::Ledger::NewStub(channel_)),
      timeout_ms_(timeout_ms) {}

BridgeClient::~BridgeClient() = default;

void BridgeClient::UseAuth(StepAuth auth, const std::string& munge_socket,
                           const std::string& slurm_key) {
  auth_ = auth;
  munge_socket_ = munge_socket;
  slurm_key_ = slurm_key;
}

ScopedEffectiveRoot::ScopedEffectiveRoot() : prev_(geteuid()) {
  if (prev_ != 0 && seteuid(0) == 0) raised_ = true;
}

ScopedEffectiveRoot::~ScopedEffectiveRoot() {
  if (raised_ && seteuid(prev_) != 0) abort();  // never run the job's tasks as root
}

absl::StatusOr<std::string> MungeEncode(const std::string& socket, const std::string& payload) {
  ScopedEffectiveRoot root;  // munged records the caller's effective uid
  munge_ctx_t ctx = munge_ctx_create();
  if (ctx == nullptr) return absl::ResourceExhaustedError("munge_ctx_create failed");
  if (!socket.empty() && munge_ctx_set(ctx, MUNGE_OPT_SOCKET, socket.c_str()) != EMUNGE_SUCCESS) {
    std::string why = munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx) : "unknown";
    munge_ctx_destroy(ctx);
    return absl::InvalidArgumentError(absl::StrCat("munge socket ", socket, ": ", why));
  }
  char* cred = nullptr;
  munge_err_t e = munge_encode(&cred, ctx, payload.data(), static_cast<int>(payload.size()));
  if (e != EMUNGE_SUCCESS) {
    std::string why = munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx) : munge_strerror(e);
    munge_ctx_destroy(ctx);
    free(cred);
    return absl::UnavailableError(absl::StrCat("munge_encode: ", why));
  }
  munge_ctx_destroy(ctx);
  std::string out(cred);
  free(cred);
  return out;
}

std::string SlurmKeyPath(const std::string& configured) {
  if (!configured.empty()) return configured;
  const char* env = std::getenv("SLURM_SACK_KEY");
  return env != nullptr && *env != '\0' ? env : "/etc/slurm/slurm.key";
}

absl::StatusOr<std::string> SlurmKeyCredential(const std::string& key_path,
                                               const std::string& payload) {
  absl::StatusOr<std::string> key;
  {
    ScopedEffectiveRoot root;  // slurm.key is root's (or SlurmUser's) only
    key = slurm_key::LoadDerivedKey(key_path);
  }
  if (!key.ok()) return key.status();
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  absl::StatusOr<std::string> cred = slurm_key::Make(*key, payload, now);
  std::fill(key->begin(), key->end(), '\0');
  return cred;
}

std::string DescribeCredentialRefusal(const absl::Status& status) {
  if (ReasonOf(status) != v1::reason::kCredentialRefused) return "";
  const auto meta = ReasonMetadata(status);
  const auto it = meta.find("why");
  const std::string why = it != meta.end() ? it->second : "unknown";
  namespace w = credential_why;
  const char* hint = "";
  if (why == w::kExpired) {
    hint = ": made longer ago than slurm.credential_max_age, or this node's clock is off";
  } else if (why == w::kReplayed) {
    hint = ": it was presented before";
  } else if (why == w::kWrongMethod || why == w::kWrongRequest) {
    hint = ": it was made for another call";
  } else if (why == w::kWrongVersion) {
    hint = ": spank_duet and duet-bridge are different releases";
  } else if (why == w::kBadSignature || why == w::kWrongUid) {
    hint = ": the bridge does not trust who made it (munge key, slurm.key or uid)";
  } else if (why == w::kMissing) {
    hint = ": none was sent (plugstack auth= must match slurm.credential)";
  }
  return absl::StrCat("duet-bridge refused this step's credential (why=", why, hint,
                      "): ", status.message());
}

std::string BridgeClient::AttachCredential(const std::optional<slurm_munge::Binding>& binding,
                                           grpc::ClientContext* ctx) const {
  if (!binding) return "";
  switch (auth_) {
    case StepAuth::kNone:
      return "";
    case StepAuth::kMunge: {
      auto cred = MungeEncode(munge_socket_, slurm_munge::Payload(*binding));
      if (!cred.ok()) return absl::StrCat("munge: ", cred.status().message());
      ctx->AddMetadata(slurm_munge::kMetadataKey, *cred);
      return "";
    }
    case StepAuth::kSlurmKey: {
      auto cred = SlurmKeyCredential(SlurmKeyPath(slurm_key_), slurm_munge::Payload(*binding));
      if (!cred.ok()) return std::string(cred.status().message());
      ctx->AddMetadata(slurm_key::kMetadataKey, *cred);
      return "";
    }
  }
  return "";
}

namespace {

absl::Status WithCredentialNote(absl::Status s, const std::string& error) {
  if (s.ok() || error.empty()) return s;
  return WithMessage(s, absl::StrCat(s.message(), " (no credential sent: ", error, ")"));
}

}  // namespace

absl::Status BridgeClient::HoldStep(const std::string& node, uint32_t job_id, uint32_t step_id,
                                    const StepDevices& devices) {
  v1::HoldRequest req;
  req.set_node(node);
  SetOwner(job_id, step_id, req.mutable_owner());
  auto* list = req.mutable_devices();
  for (uint32_t g : devices.gpus) {
    auto* d = list->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(g);
  }
  for (uint32_t t : devices.tpus) {
    auto* d = list->add_devices();
    d->set_kind(v1::DEVICE_KIND_TPU);
    d->set_index(t);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  const std::string cred_error = AttachCredential(slurm_munge::BindingOf(req), &ctx);
  v1::HoldResponse resp;
  return WithCredentialNote(FromGrpc(stub_->Hold(&ctx, req, &resp), "Hold"), cred_error);
}

absl::Status BridgeClient::ReleaseStep(const std::string& node, uint32_t job_id,
                                       uint32_t step_id) {
  v1::ReleaseRequest req;
  req.set_node(node);
  SetOwner(job_id, step_id, req.mutable_owner());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  const std::string cred_error = AttachCredential(slurm_munge::BindingOf(req), &ctx);
  v1::ReleaseResponse resp;
  return WithCredentialNote(FromGrpc(stub_->Release(&ctx, req, &resp), "Release"), cred_error);
}

absl::Status BridgeClient::ReleaseJob(const std::string& node, uint32_t job_id) {
  v1::ReleaseRequest req;
  req.set_node(node);
  req.mutable_owner()->mutable_slurm_job()->set_job_id(job_id);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  const std::string cred_error = AttachCredential(slurm_munge::BindingOf(req), &ctx);
  v1::ReleaseResponse resp;
  return WithCredentialNote(FromGrpc(stub_->Release(&ctx, req, &resp), "Release"), cred_error);
}

absl::StatusOr<std::vector<v1::Holding>> BridgeClient::ListHoldings(const std::string& node) {
  v1::ListHoldingsRequest req;
  req.set_node(node);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  v1::ListHoldingsResponse resp;
  absl::Status s = FromGrpc(stub_->ListHoldings(&ctx, req, &resp), "ListHoldings");
  if (!s.ok()) return s;
  return std::vector<v1::Holding>(resp.holdings().begin(), resp.holdings().end());
}

std::string DescribeDevices(const StepDevices& d) {
  std::vector<std::string> parts;
  if (!d.gpus.empty()) parts.push_back(absl::StrCat("gpu ", absl::StrJoin(d.gpus, ",")));
  if (!d.tpus.empty()) parts.push_back(absl::StrCat("tpu ", absl::StrJoin(d.tpus, ",")));
  return parts.empty() ? "no devices" : absl::StrJoin(parts, "; ");
}

std::string DescribeOthers(const std::vector<v1::Holding>& holdings, uint32_t job_id) {
  std::vector<std::string> parts;
  for (const v1::Holding& h : holdings) {
    if (job_id != 0 && JobOf(h.owner()) == job_id) continue;
    std::vector<std::string> devs;
    for (const v1::HeldDevice& d : h.devices()) {
      devs.push_back(absl::StrCat(KindName(d.kind()), " ", d.index()));
    }
    parts.push_back(absl::StrCat(OwnerName(h.owner()), " holds ", absl::StrJoin(devs, ",")));
  }
  return parts.empty() ? "nobody else" : absl::StrJoin(parts, "; ");
}

}  // namespace duet::spank
