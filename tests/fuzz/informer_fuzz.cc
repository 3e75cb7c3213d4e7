// Fuzzes the informer (k8s_adapter/informer.h) with arbitrary list bodies and
// watch frames from a scripted KubeClient. The input is a sequence of replies
// separated by an empty line ("\n\n"); each Get or Stream call takes the next
// one, in call order: a Get gets it as its body, a Stream gets its lines as
// frames. A reply "!<code> <body>" is answered as an HTTP error instead (e.g.
// "!410" for Gone). When the replies run out, a Get fails and a Stream stays
// open until the harness closes it (as a dropped connection) before stopping
// the informer.
//
// Checks beyond "no crash, no sanitizer report": no exception escapes; every
// object handed to OnUpsert is a JSON object with metadata; a deletion after a
// relist (no last state) names only a key the handler was given before;
// Stop() returns and no handler call follows it.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "k8s_adapter/informer.h"
#include "k8s_adapter/kube_client.h"

namespace {

using duet::k8s::KubeClient;

class ScriptedClient : public KubeClient {
 public:
  explicit ScriptedClient(std::deque<std::string> replies) : replies_(std::move(replies)) {}

  absl::StatusOr<std::string> Get(const std::string&) override {
    absl::StatusOr<std::string> r = Next();
    if (!r.ok()) return r.status();
    return Reply(*r);
  }
  absl::StatusOr<std::string> Post(const std::string&, const std::string&) override { return Refuse(); }
  absl::StatusOr<std::string> Put(const std::string&, const std::string&) override { return Refuse(); }
  absl::StatusOr<std::string> Patch(const std::string&, const std::string&, duet::k8s::PatchType) override {
    return Refuse();
  }
  absl::StatusOr<std::string> Delete(const std::string&) override { return Refuse(); }

  absl::Status Stream(const std::string&, const duet::k8s::StreamOptions& options,
                      const std::function<absl::Status(absl::string_view line)>& on_line) override {
    absl::StatusOr<std::string> r = Next();
    if (!r.ok()) {
      // Out of replies: a watch that stays open until Close().
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(&closed_));
      return absl::UnavailableError("closed");
    }
    absl::StatusOr<std::string> body = Reply(*r);
    if (!body.ok()) return body.status();
    for (absl::string_view line : absl::StrSplit(*body, '\n', absl::SkipEmpty())) {
      if (line.size() > options.max_line_bytes) return absl::ResourceExhaustedError("line too long");
      absl::Status s = on_line(line);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Returns once a call has found no reply left.
  void AwaitDrained() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&drained_));
  }
  void Close() {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }

 private:
  static absl::Status Refuse() { return absl::UnimplementedError("the informer only reads"); }

  absl::StatusOr<std::string> Next() {
    absl::MutexLock l(&mu_);
    if (replies_.empty()) {
      drained_ = true;
      return absl::UnavailableError("no reply left");
    }
    std::string r = std::move(replies_.front());
    replies_.pop_front();
    return r;
  }

  // "!<code> <body>": the HTTP error the client would return.
  static absl::StatusOr<std::string> Reply(const std::string& r) {
    if (r.empty() || r[0] != '!') return r;
    const size_t space = r.find(' ');
    int code = 500;
    if (!absl::SimpleAtoi(r.substr(1, space == std::string::npos ? std::string::npos : space - 1), &code) ||
        code < 100 || code > 599) {
      code = 500;
    }
    absl::Status s =
        duet::k8s::StatusFromHttp(code, space == std::string::npos ? "" : absl::string_view(r).substr(space + 1));
    if (s.ok()) return std::string(space == std::string::npos ? "" : r.substr(space + 1));
    return s;
  }

  absl::Mutex mu_;
  std::deque<std::string> replies_ ABSL_GUARDED_BY(mu_);
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class CheckingHandler : public duet::k8s::InformerHandler {
 public:
  void OnUpsert(const nlohmann::json& object) override {
    Check();
    if (!object.is_object() || !object.contains("metadata")) std::abort();
    known_.insert(KeyOf(object));
  }
  void OnDelete(const std::string& key, const nlohmann::json* last) override {
    Check();
    // A relist deletes only what it delivered; a DELETED frame may name
    // anything the server says.
    if (last == nullptr && !known_.contains(key)) std::abort();
    known_.erase(key);
  }
  void OnSynced() override { Check(); }

  std::atomic<bool> stopped{false};

 private:
  void Check() const {
    if (stopped.load()) std::abort();
  }
  static std::string KeyOf(const nlohmann::json& o) {
    const nlohmann::json& md = o.at("metadata");
    const std::string name = md.value("name", "");
    const std::string ns = md.value("namespace", "");
    return ns.empty() ? name : ns + "/" + name;
  }

  absl::flat_hash_set<std::string> known_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::deque<std::string> replies;
  for (absl::string_view r : absl::StrSplit(input, "\n\n")) replies.emplace_back(r);

  ScriptedClient client(std::move(replies));
  CheckingHandler handler;
  duet::k8s::InformerOptions options;
  options.path = "/api/v1/pods";
  options.page_size = 2;
  options.min_backoff = absl::Microseconds(1);
  options.max_backoff = absl::Microseconds(1);
  options.max_frame_bytes = 4096;
  {
    duet::k8s::Informer informer(&client, options, &handler);
    if (informer.Start().ok()) client.AwaitDrained();
    client.Close();
    informer.Stop();
    handler.stopped = true;
    (void)informer.stats();
  }
  return 0;
}
