// Differential fuzzing of the extender's request bodies: the simdjson fast
// path (ParseExtenderArgsFast) against the general path the server falls
// back to (nlohmann::json::parse + ParseExtenderArgs). Checks: whenever the
// fast path accepts a body, the general path accepts it too and gives the
// same pod and node names (types.h promises it); neither crashes or throws.
// Also prioritize's fast path (ParsePrioritizeArgsFast) against the full
// one, and ParseBindingArgs and ParsePodRequest over what was parsed.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "k8s_adapter/extender/types.h"
#include "nlohmann/json.hpp"

namespace {

using duet::extender::ExtenderArgs;
using json = nlohmann::json;

void CheckRefusal(const absl::Status& s) {
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  const std::optional<ExtenderArgs> fast = duet::extender::ParseExtenderArgsFast(body);

  // The general path, as the server runs it (server.cc ParseBody: any
  // json::exception is a bad request).
  std::optional<json> parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::exception&) {
  }
  if (!parsed.has_value()) {
    if (fast.has_value()) std::abort();  // the fast path accepted what is not JSON
    return 0;
  }
  CheckRefusal(duet::extender::ParseBindingArgs(*parsed).status());
  // Moved in, as the server does: a copy of a deeply nested document would
  // recurse (nlohmann copies recursively) where the server never does.
  const absl::StatusOr<ExtenderArgs> general =
      duet::extender::ParseExtenderArgs(std::move(*parsed));
  CheckRefusal(general.status());
  if (fast.has_value()) {
    if (!general.ok()) std::abort();
    if (fast->pod != general->pod) std::abort();
    if (fast->node_names != general->node_names) std::abort();
    if (fast->from_node_list != general->from_node_list) std::abort();
  }
  // Prioritize's fast path reads the same bodies with the pod left as text:
  // it accepts whatever the full fast path accepts, with the same names and
  // the pod's text; anything more it accepts has a pod text that does not
  // parse (the server then takes the general path).
  const std::optional<duet::extender::PrioritizeArgs> prio =
      duet::extender::ParsePrioritizeArgsFast(body);
  if (fast.has_value()) {
    if (!prio.has_value()) std::abort();
    if (prio->pod_text != fast->pod_text) std::abort();
    if (prio->node_names.size() != fast->node_names.size()) std::abort();
    for (size_t i = 0; i < prio->node_names.size(); ++i) {
      if (prio->node_names[i] != fast->node_names[i]) std::abort();
    }
    const std::optional<json> pod = duet::extender::ParsePodText(prio->pod_text);
    if (!pod.has_value() || *pod != fast->pod) std::abort();
  } else if (prio.has_value() && duet::extender::ParsePodText(prio->pod_text).has_value()) {
    std::abort();
  }
  if (general.ok()) {
    CheckRefusal(duet::extender::ParsePodRequest(general->pod).status());
    (void)duet::extender::PodRefOf(general->pod);
  }
  return 0;
}
