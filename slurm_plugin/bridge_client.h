#pragma once

// The plugin's calls to duet-bridge (duet.v1.Ledger): register a step's
// devices, release them, list who holds what on a node.
//
// A BridgeClient owns its gRPC channel. slurmstepd forks the tasks after
// user_init, and gRPC does not survive fork, so the plugin makes a client,
// makes its calls and destroys it before returning (gRPC's threads go with
// the last channel); nothing gRPC is alive when the tasks fork.
//
// Thread-safety: not thread-safe (one slurmstepd thread uses it).

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/credential/munge_payload.h"
#include "duet/v1/duet.grpc.pb.h"
#include "slurm_plugin/plugin_config.h"
#include "slurm_plugin/step_devices.h"

namespace duet::spank {

class BridgeClient {
 public:
  // `target`: unix:///path or host:port. Each call has `timeout_ms`.
  BridgeClient(const std::string& target, int timeout_ms);
  // The credential attached to HoldStep, ReleaseStep and ReleaseJob
  // (DESIGN.md §9): kMunge, slurm_munge::Payload of the call's Binding
  // (request_digest.h: method, node, owner, request digest) encoded through
  // munged at `munge_socket` ("" = libmunge's default); kSlurmKey,
  // slurm_key::Make of the same payload under the slurm.key at `slurm_key`
  // ("" = SlurmKeyPath's default), read as root for each call; kNone (the
  // default), nothing. When making one fails the call goes without it and a
  // refusal by the bridge names the local failure.
  void UseAuth(StepAuth auth, const std::string& munge_socket, const std::string& slurm_key);
  ~BridgeClient();

  // Hold(owner=slurm_step{job, step}, devices). Errors keep the bridge's code
  // and message (RESOURCE_EXHAUSTED names node, device and holder);
  // UNAVAILABLE / DEADLINE_EXCEEDED when the bridge cannot be reached.
  absl::Status HoldStep(const std::string& node, uint32_t job_id, uint32_t step_id,
                        const StepDevices& devices);
  absl::Status ReleaseStep(const std::string& node, uint32_t job_id, uint32_t step_id);
  // Release(owner=slurm_job{job}): what job import recorded for the job on
  // `node` (its steps keep their own holdings). OK when there was none.
  absl::Status ReleaseJob(const std::string& node, uint32_t job_id);
  absl::StatusOr<std::vector<v1::Holding>> ListHoldings(const std::string& node);

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
  int timeout_ms_;
  // Adds the credential to `ctx`; returns why it could not ("" when it did
  // or when none is configured).
  std::string AttachCredential(const std::optional<slurm_munge::Binding>& binding,
                               grpc::ClientContext* ctx) const;

  StepAuth auth_ = StepAuth::kNone;
  std::string munge_socket_;
  std::string slurm_key_;
};

// slurmstepd runs user_init with its effective uid dropped to the job's user
// (the saved uid stays root). The bridge's socket is not the user's to
// connect to, and munged records the caller's effective uid in a credential
// (the bridge accepts root's), so the plugin's calls run with the effective
// uid raised back to root for the scope of this object, then dropped again.
// No-op when already root or when raising fails (the call then goes as the
// user and the bridge or the socket refuses it).
class ScopedEffectiveRoot {
 public:
  ScopedEffectiveRoot();
  ~ScopedEffectiveRoot();
  ScopedEffectiveRoot(const ScopedEffectiveRoot&) = delete;
  ScopedEffectiveRoot& operator=(const ScopedEffectiveRoot&) = delete;

 private:
  uid_t prev_;
  bool raised_ = false;
};

// Encodes `payload` into a munge credential through munged at `socket` ("" =
// libmunge's default). UNAVAILABLE names munge's error.
absl::StatusOr<std::string> MungeEncode(const std::string& socket, const std::string& payload);

// The slurm.key the plugin reads: `configured`, else $SLURM_SACK_KEY, else
// /etc/slurm/slurm.key (where Slinky's NodeSet pods mount it).
std::string SlurmKeyPath(const std::string& configured);

// A slurm_key credential for `payload` (slurm_munge::Payload of the call),
// now, under the key at `key_path` (read with ScopedEffectiveRoot). Errors
// name the file.
absl::StatusOr<std::string> SlurmKeyCredential(const std::string& key_path,
                                               const std::string& payload);

// One line for the user's stderr when the bridge refused the call's
// credential (reason CREDENTIAL_REFUSED): what it means and the bridge's
// message, e.g. "duet-bridge refused this step's credential (why=expired:
// made longer ago than slurm.credential_max_age; check the node's clock):
// ...". "" for any other status.
std::string DescribeCredentialRefusal(const absl::Status& status);

// One line for users: "gpu 0,1; tpu 2,3".
std::string DescribeDevices(const StepDevices& devices);
// "pod default/web-1 holds gpu 2,3; slurm job 7 step 0 holds gpu 4" for the
// node's holdings other than this step's job.
std::string DescribeOthers(const std::vector<v1::Holding>& holdings, uint32_t job_id);

}  // namespace duet::spank
