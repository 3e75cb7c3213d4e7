#pragma once

// List+watch of one resource, the way client-go's reflector does it: a paged
// list, then a watch from the list's resourceVersion with bookmarks; a watch
// that ends is resumed from the last resourceVersion seen; 410 Gone, a frame
// that does not parse or one over the size limit → relist, and the relist is
// diffed against what was delivered so deletions missed in the gap are
// delivered too. Failures back off exponentially with jitter.
//
// Memory: the informer keeps only each object's key and resourceVersion; a
// frame is bounded by max_frame_bytes and a list page by page_size.

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {

struct InformerOptions {
  // Collection path, e.g. "/api/v1/nodes" or "/api/v1/pods".
  std::string path;
  std::string label_selector;
  std::string field_selector;
  // Objects per list page (limit/continue).
  int page_size = 500;
  // Backoff between failed attempts: doubles from min to max; each wait is
  // uniform in [d/2, d].
  absl::Duration min_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(30);
  // Asked of the server (timeoutSeconds), randomized in [t, 2t) so replicas
  // do not reconnect in step. The watch then resumes without a relist.
  absl::Duration watch_timeout = absl::Minutes(5);
  // No bytes on a watch for this long: the connection is presumed dead.
  // Bookmarks (about once a minute on a real apiserver) keep it alive.
  absl::Duration idle_timeout = absl::Minutes(3);
  // A watch frame larger than this is refused (logged) and followed by a relist.
  size_t max_frame_bytes = 16 << 20;
};

// Called from one thread at a time: the caller of Start() during the first
// list, then the informer's own thread. Calls must not block for long.
class InformerHandler {
 public:
  virtual ~InformerHandler() = default;
  // An object was added or changed (a relist delivers only objects whose
  // resourceVersion differs from the last delivered).
  virtual void OnUpsert(const nlohmann::json& object) = 0;
  // An object is gone. `key` is "namespace/name" or "name"; `last` is its
  // final state when a DELETED frame carried it, null after a relist.
  virtual void OnDelete(const std::string& key, const nlohmann::json* last) = 0;
  // A list (the first or a relist) has been applied: the handler's view now
  // matches the server at one resourceVersion.
  virtual void OnSynced() = 0;
};

struct InformerStats {
  uint64_t lists = 0;         // complete lists (first + relists)
  uint64_t watches = 0;       // watch requests opened
  uint64_t events = 0;        // ADDED/MODIFIED/DELETED frames applied
  uint64_t bookmarks = 0;
  uint64_t gone = 0;          // 410s (frame or HTTP)
  uint64_t frame_errors = 0;  // unparseable or oversized frames
  uint64_t failures = 0;      // failed list or watch attempts (then backoff)
  std::string resource_version;
  std::string last_error;
  size_t objects = 0;
};

// Thread-safe: Start/Stop from one owner thread; stats() from any.
class Informer {
 public:
  Informer(KubeClient* client, InformerOptions options, InformerHandler* handler);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Lists once, delivering every object and OnSynced(), then watches on a
  // thread of its own. The first list's error otherwise (nothing started).
  absl::Status Start();
  // Idempotent; no handler calls after it returns.
  void Stop();
  InformerStats stats() const;

 private:
  void Run();
  // Lists every page and diffs against store_. Sets rv_.
  absl::Status List();
  // One watch request from rv_. OK when the server ended it cleanly.
  absl::Status Watch();
  absl::Status OnFrame(absl::string_view line);
  // Waits `d` or until Stop(); false when stopping.
  bool Sleep(absl::Duration d);
  absl::Duration NextBackoff(int attempt);
  void Fail(const absl::Status& s);

  static std::string Key(const nlohmann::json& object);

  KubeClient* const client_;
  const InformerOptions options_;
  InformerHandler* const handler_;

  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Owned by whoever is running the loop (Start's caller, then thread_).
  absl::flat_hash_map<std::string, std::string> store_;  // key → resourceVersion
  std::string rv_;
  // Set when the current watch must be followed by a relist.
  bool relist_ = false;
  absl::BitGen rng_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  InformerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k8s
}  // namespace duet
