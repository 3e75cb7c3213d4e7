// Fuzzes the slurm.key credential (common/credential/slurm_key_cred.h) the bridge
// reads from gRPC metadata. The input's first line is the credential; the
// rest, if any, is the node name. Checks: Parse never crashes and refuses
// with INVALID_ARGUMENT; what it accepts has a 32-hex-digit nonce and a
// 64-hex-digit MAC and a payload of 1 to 1024 bytes; MacMatches never
// crashes on any parsed credential; a credential Make gives for a payload
// naming the node parses, matches and carries that payload, and stops
// matching once its payload is swapped for another's; comparing any parsed
// payload with a call's (munge_payload.h Compare, duet/v3 and duet/v2) never
// crashes, and a payload equal to the call's own, in either version, is the
// only kind accepted.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "common/credential/munge_payload.h"
#include "common/credential/slurm_key_cred.h"

namespace {

bool LowerHex(const std::string& s, size_t len) {
  if (s.size() != len) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace sk = duet::slurm_key;
  static const std::string key = sk::DeriveKey("0123456789abcdef0123456789abcdef");
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string cred = in.substr(0, nl);
  const std::string node = nl == std::string::npos ? "node-0" : in.substr(nl + 1);

  const absl::StatusOr<sk::Parsed> p = sk::Parse(cred);
  if (!p.ok()) {
    if (p.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  } else {
    if (!LowerHex(p->nonce, 32) || !LowerHex(p->mac, 64)) std::abort();
    if (p->payload.empty() || p->payload.size() > 1024) std::abort();
    (void)sk::MacMatches(key, *p);
    duet::slurm_munge::Binding want;
    want.method = "Hold";
    want.node = "node-0";
    want.job_id = 7;
    want.step_id = 1;
    want.request = "Hold node=6:node-0 owner=slurm_step:7.1 devices=1:0:0 generation=0";
    const bool same = p->payload == duet::slurm_munge::Payload(want) ||
                      p->payload == duet::slurm_munge::PreviousPayload(want);
    if ((duet::slurm_munge::Compare(p->payload, want) == duet::slurm_munge::Mismatch::kNone) !=
        same) {
      std::abort();
    }
  }

  const std::string payload =
      "duet/v3 Hold node=" + node.substr(0, 900) + " owner=slurm_step:7.1 generation=0";
  const absl::StatusOr<std::string> made = sk::Make(key, payload, 1700000000);
  if (!made.ok()) std::abort();
  absl::StatusOr<sk::Parsed> mp = sk::Parse(*made);
  if (!mp.ok()) std::abort();
  if (!sk::MacMatches(key, *mp) || mp->payload != payload) std::abort();
  mp->payload += " ";
  if (sk::MacMatches(key, *mp)) std::abort();
  return 0;
}
