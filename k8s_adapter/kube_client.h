#pragma once

// A small Kubernetes API client: JSON requests and line-streamed watches over
// HTTP(S). `KubeClient` is the seam tests replace; `NewCurlKubeClient` is the
// real one (libcurl).
//
// Errors (absl::Status) from an HTTP reply carry the apiserver's Status
// message: 400/422 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403
// PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS (reason AlreadyExists)
// or ABORTED (a conflict: stale resourceVersion, pod already bound), 410
// OUT_OF_RANGE (resourceVersion too old: relist), 415 INVALID_ARGUMENT, 429
// RESOURCE_EXHAUSTED, 5xx UNAVAILABLE. Transport failures (refused, reset,
// TLS) are UNAVAILABLE, timeouts DEADLINE_EXCEEDED.

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "k8s_adapter/kube_config.h"

namespace duet {
namespace k8s {

enum class PatchType { kMerge, kStrategicMerge };

struct StreamOptions {
  // A line (one watch frame) longer than this ends the stream with
  // RESOURCE_EXHAUSTED; nothing larger is ever buffered.
  size_t max_line_bytes = 16 << 20;
  // No bytes for this long ends the stream with DEADLINE_EXCEEDED (a dead
  // peer). Zero: no limit.
  absl::Duration idle_timeout = absl::ZeroDuration();
  // Set to true from another thread to end the stream (CANCELLED) within
  // about a second.
  const std::atomic<bool>* cancel = nullptr;
};

// Thread-safe: calls may run concurrently.
class KubeClient {
 public:
  virtual ~KubeClient() = default;
  // `path` is the URL path and query ("/api/v1/nodes?limit=500"). On 2xx the
  // reply body; otherwise the error above.
  virtual absl::StatusOr<std::string> Get(const std::string& path) = 0;
  virtual absl::StatusOr<std::string> Post(const std::string& path, const std::string& json) = 0;
  virtual absl::StatusOr<std::string> Put(const std::string& path, const std::string& json) = 0;
  virtual absl::StatusOr<std::string> Patch(const std::string& path, const std::string& json,
                                            PatchType type) = 0;
  virtual absl::StatusOr<std::string> Delete(const std::string& path) = 0;
  // GETs `path` and calls `on_line` with each newline-terminated line (the
  // newline removed; empty lines skipped) as it arrives. Returns OK when the
  // server ends the reply; an HTTP error as above; UNAVAILABLE when the
  // connection drops mid-stream; the first non-OK status `on_line` returns
  // (which ends the stream); or the StreamOptions errors.
  virtual absl::Status Stream(const std::string& path, const StreamOptions& options,
                              const std::function<absl::Status(absl::string_view line)>& on_line) = 0;
};

struct KubeClientOptions {
  absl::Duration connect_timeout = absl::Seconds(10);
  // Whole-request limit for Get/Post/Put/Patch/Delete (not Stream).
  absl::Duration request_timeout = absl::Seconds(60);
  // Larger replies fail with RESOURCE_EXHAUSTED (lists are paged well below).
  size_t max_response_bytes = 256 << 20;
  std::string user_agent = "duet-bridge/0.1";
  // How often a token_file is re-read.
  absl::Duration token_reload = absl::Minutes(1);
};

// INVALID_ARGUMENT when the config cannot be used (no server, unreadable
// CA or client certificate file).
absl::StatusOr<std::unique_ptr<KubeClient>> NewCurlKubeClient(KubeConfig config,
                                                              KubeClientOptions options = {});

// The Status for an HTTP reply `code` with `body` (an apiserver Status object
// or anything else). OK for 2xx.
absl::Status StatusFromHttp(long code, absl::string_view body);

// Percent-encodes a query parameter value.
std::string QueryEscape(absl::string_view value);

}  // namespace k8s
}  // namespace duet
