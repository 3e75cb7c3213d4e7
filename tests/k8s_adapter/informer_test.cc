#include "k8s_adapter/informer.h"

#include <deque>
#include <map>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using testing::FakeApiServer;
using testing::GoldenNode;
using testing::WaitFor;

// Mirrors what the informer delivers: name → resourceVersion.
class Mirror : public InformerHandler {
 public:
  void OnUpsert(const nlohmann::json& o) override {
    absl::MutexLock l(&mu_);
    objects_[o["metadata"]["name"].get<std::string>()] = o["metadata"]["resourceVersion"].get<std::string>();
    ++upserts_;
  }
  void OnDelete(const std::string& key, const nlohmann::json* last) override {
    absl::MutexLock l(&mu_);
    objects_.erase(key);
    deletes_.push_back({key, last != nullptr});
  }
  void OnSynced() override {
    absl::MutexLock l(&mu_);
    ++syncs_;
  }
  std::set<std::string> names() {
    absl::MutexLock l(&mu_);
    std::set<std::string> out;
    for (const auto& [k, v] : objects_) out.insert(k);
    return out;
  }
  std::string rv(const std::string& name) {
    absl::MutexLock l(&mu_);
    auto it = objects_.find(name);
    return it == objects_.end() ? "" : it->second;
  }
  int syncs() {
    absl::MutexLock l(&mu_);
    return syncs_;
  }
  std::vector<std::pair<std::string, bool>> deletes() {
    absl::MutexLock l(&mu_);
    return deletes_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> objects_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, bool>> deletes_ ABSL_GUARDED_BY(mu_);
  int upserts_ ABSL_GUARDED_BY(mu_) = 0;
  int syncs_ ABSL_GUARDED_BY(mu_) = 0;
};

nlohmann::json Node(const std::string& name) { return GoldenNode("gke_a3_h100_node.json", name); }

class InformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_ || true);
  }
  void Make(std::vector<std::string> fake_args = {}, InformerOptions o = {}) {
    fake_ = std::make_unique<FakeApiServer>(fake_args);
    ASSERT_TRUE(fake_->ok());
    KubeConfig c;
    c.server = fake_->url();
    client_ = *NewCurlKubeClient(c);
    o.path = "/api/v1/nodes";
    o.min_backoff = absl::Milliseconds(20);
    o.max_backoff = absl::Milliseconds(200);
    options_ = o;
  }
  void StartInformer() {
    informer_ = std::make_unique<Informer>(client_.get(), options_, &mirror_);
    ASSERT_TRUE(informer_->Start().ok());
  }
  // The fake's current objects == what the informer delivered.
  bool Converged() {
    auto list = client_->Get("/api/v1/nodes" +
                             (options_.label_selector.empty()
                                  ? std::string()
                                  : "?labelSelector=" + QueryEscape(options_.label_selector)));
    if (!list.ok()) return false;
    std::set<std::string> want;
    bool rv_match = true;
    const nlohmann::json parsed = nlohmann::json::parse(*list);
    for (const auto& n : parsed["items"]) {
      std::string name = n["metadata"]["name"];
      want.insert(name);
      rv_match = rv_match && mirror_.rv(name) == n["metadata"]["resourceVersion"];
    }
    return rv_match && want == mirror_.names();
  }
  void TearDown() override {
    if (informer_) informer_->Stop();
  }

  std::unique_ptr<FakeApiServer> fake_;
  std::unique_ptr<KubeClient> client_;
  InformerOptions options_;
  Mirror mirror_;
  std::unique_ptr<Informer> informer_;
};

TEST_F(InformerTest, PagedListThenWatch) {
  InformerOptions o;
  o.page_size = 2;
  Make({}, o);
  for (int i = 0; i < 5; ++i) fake_->Put(Node("n" + std::to_string(i)));
  StartInformer();
  EXPECT_EQ(mirror_.names().size(), 5u);  // delivered before Start returned
  EXPECT_EQ(mirror_.syncs(), 1);
  int pages = 0;
  for (const auto& r : fake_->Requests()) {
    if (r["path"].get<std::string>().rfind("/api/v1/nodes?limit=2", 0) == 0) ++pages;
  }
  EXPECT_EQ(pages, 3);
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Put(Node("n5"));
  nlohmann::json n1 = Node("n1");
  n1["spec"]["unschedulable"] = true;
  fake_->Put(n1);
  fake_->Delete("Node", "n0");
  ASSERT_TRUE(WaitFor([&] { return Converged(); }));
  EXPECT_EQ(mirror_.deletes(), (std::vector<std::pair<std::string, bool>>{{"n0", true}}));
  InformerStats s = informer_->stats();
  EXPECT_EQ(s.lists, 1u);
  EXPECT_EQ(s.events, 3u);
  // The watch asked for bookmarks and resumed from the list's version.
  bool saw = false;
  for (const auto& r : fake_->Requests()) {
    std::string p = r["path"];
    if (p.find("watch=1") != std::string::npos) {
      saw = true;
      EXPECT_NE(p.find("allowWatchBookmarks=true"), std::string::npos);
      EXPECT_NE(p.find("timeoutSeconds="), std::string::npos);
    }
  }
  EXPECT_TRUE(saw);
}

TEST_F(InformerTest, WatchDroppedMidStreamResumesWithoutRelist) {
  Make();
  fake_->Put(Node("a"));
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Control("drop");
  fake_->Put(Node("b"));  // while no watch is open
  ASSERT_TRUE(WaitFor([&] { return Converged() && fake_->OpenWatches() == 1; }));
  InformerStats s = informer_->stats();
  EXPECT_EQ(s.lists, 1u);
  EXPECT_GE(s.watches, 2u);
}

TEST_F(InformerTest, GoneRelistsAndDeliversDeletionsFromTheGap) {
  Make();
  fake_->Put(Node("a"));
  fake_->Put(Node("b"));
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  // Blind the informer: every request fails, then drop its watch.
  fake_->Control("fail", {{"count", 1000000}, {"code", 503}});
  fake_->Control("drop");
  fake_->Delete("Node", "a");
  fake_->Put(Node("c"));
  fake_->Control("compact");  // the informer's resourceVersion is now gone
  fake_->Control("fail", {{"count", 0}});
  ASSERT_TRUE(WaitFor([&] { return Converged(); }));
  EXPECT_EQ(mirror_.deletes(), (std::vector<std::pair<std::string, bool>>{{"a", false}}));
  InformerStats s = informer_->stats();
  EXPECT_EQ(s.lists, 2u);
  EXPECT_EQ(s.gone, 1u);
  EXPECT_GE(s.failures, 1u);
  EXPECT_EQ(mirror_.syncs(), 2);
}

TEST_F(InformerTest, GoneAsHttp410AndAsExpiredWatch) {
  Make();
  fake_->Put(Node("a"));
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  // An open watch ended with an ERROR 410 frame.
  fake_->Control("compact", {{"expire_watches", true}});
  ASSERT_TRUE(WaitFor([&] { return informer_->stats().lists == 2; }));
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  // The watch request itself answered 410.
  fake_->Control("gone_mode", {{"mode", "http"}});
  fake_->Control("fail", {{"count", 1000000}});
  fake_->Control("drop");
  fake_->Put(Node("b"));
  fake_->Control("compact");
  fake_->Control("fail", {{"count", 0}});
  ASSERT_TRUE(WaitFor([&] { return Converged() && informer_->stats().lists == 3; }));
  EXPECT_EQ(informer_->stats().gone, 2u);
}

TEST_F(InformerTest, BookmarksAdvanceTheResourceVersion) {
  Make({"--bookmark-interval", "0.1"});
  fake_->Put(Node("a"));
  StartInformer();
  const std::string rv0 = informer_->stats().resource_version;
  // Changes to other kinds move the global version; bookmarks carry it.
  nlohmann::json lease = {{"kind", "Lease"}, {"metadata", {{"name", "x"}, {"namespace", "d"}}}};
  fake_->Put(lease);
  ASSERT_TRUE(WaitFor([&] {
    InformerStats s = informer_->stats();
    return s.bookmarks >= 2 && s.resource_version != rv0;
  }));
  EXPECT_EQ(informer_->stats().lists, 1u);
}

TEST_F(InformerTest, GarbageFrameIsAClearErrorThenRelistNothingLost) {
  Make();
  fake_->Put(Node("a"));
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Control("garbage", {{"text", "{\"type\":\"ADDED\",\"object\":{\"metad"}});
  fake_->Put(Node("b"));
  ASSERT_TRUE(WaitFor([&] { return Converged() && informer_->stats().lists == 2; }));
  InformerStats s = informer_->stats();
  EXPECT_EQ(s.frame_errors, 1u);
  EXPECT_THAT(s.last_error, ::testing::HasSubstr("frame is not JSON"));
  // A well-formed frame of the wrong shape is an error too.
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Control("garbage", {{"text", "{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}"}});
  fake_->Delete("Node", "a");
  ASSERT_TRUE(WaitFor([&] { return Converged() && informer_->stats().lists == 3; }));
  EXPECT_EQ(informer_->stats().frame_errors, 2u);
}

TEST_F(InformerTest, OversizedFrameIsRefusedThenRelist) {
  InformerOptions o;
  o.max_frame_bytes = 64 << 10;
  Make({}, o);
  fake_->Put(Node("a"));
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Control("bigframe", {{"bytes", 1 << 20}});
  fake_->Put(Node("b"));
  ASSERT_TRUE(WaitFor([&] { return Converged() && informer_->stats().lists == 2; }));
  InformerStats s = informer_->stats();
  EXPECT_EQ(s.frame_errors, 1u);
  EXPECT_THAT(s.last_error, ::testing::HasSubstr("watch frame larger than 65536 bytes"));
}

TEST_F(InformerTest, SlowServerStillConverges) {
  Make();
  fake_->Put(Node("a"));
  fake_->Control("slow", {{"delay_ms", 200}});
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Put(Node("b"));
  fake_->Put(Node("c"));
  fake_->Delete("Node", "a");
  ASSERT_TRUE(WaitFor([&] { return Converged(); }));
  EXPECT_EQ(informer_->stats().lists, 1u);
}

TEST_F(InformerTest, ServerDownAtStartIsAnErrorAndLaterOutageRecovers) {
  Make();
  fake_->Control("fail", {{"count", 1}, {"code", 503}});
  informer_ = std::make_unique<Informer>(client_.get(), options_, &mirror_);
  EXPECT_EQ(informer_->Start().code(), absl::StatusCode::kUnavailable);
  informer_.reset();
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Control("fail", {{"count", 5}, {"code", 500}});
  fake_->Control("drop");
  fake_->Put(Node("late"));
  // The drop, then the informer's own retry meets an injected 500. Wait for both before
  // Converged's reads start, which would otherwise take the remaining 500s themselves.
  ASSERT_TRUE(WaitFor([&] { return informer_->stats().failures >= 2u; }));
  ASSERT_TRUE(WaitFor([&] { return Converged(); }));
}

TEST_F(InformerTest, LabelSelectorChangesAreAddsAndDeletes) {
  InformerOptions o;
  o.label_selector = "duet.dev/shared=true";
  Make({}, o);
  fake_->Put(Node("in"));  // the golden node carries duet.dev/shared=true
  nlohmann::json out = Node("out");
  out["metadata"]["labels"].erase("duet.dev/shared");
  fake_->Put(out);
  StartInformer();
  EXPECT_EQ(mirror_.names(), (std::set<std::string>{"in"}));
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  out["metadata"]["labels"]["duet.dev/shared"] = "true";
  fake_->Put(out);
  nlohmann::json in = Node("in");
  in["metadata"]["labels"]["duet.dev/shared"] = "false";
  fake_->Put(in);
  ASSERT_TRUE(WaitFor([&] { return mirror_.names() == std::set<std::string>{"out"}; }));
}

// Pods across namespaces: keys are namespace/name, so equal names in two
// namespaces are two objects, and a relist deletes the right one.
class KeyRecorder : public InformerHandler {
 public:
  void OnUpsert(const nlohmann::json& o) override {
    absl::MutexLock l(&mu_);
    keys_.insert(o["metadata"]["namespace"].get<std::string>() + "/" + o["metadata"]["name"].get<std::string>());
  }
  void OnDelete(const std::string& key, const nlohmann::json*) override {
    absl::MutexLock l(&mu_);
    keys_.erase(key);
  }
  void OnSynced() override {}
  std::set<std::string> keys() {
    absl::MutexLock l(&mu_);
    return keys_;
  }

 private:
  absl::Mutex mu_;
  std::set<std::string> keys_ ABSL_GUARDED_BY(mu_);
};

TEST_F(InformerTest, PodsAcrossNamespacesWithFieldSelector) {
  Make();
  auto pod = [](const std::string& ns, const std::string& name, const std::string& scheduler) {
    return nlohmann::json{{"kind", "Pod"},
                          {"metadata", {{"name", name}, {"namespace", ns}}},
                          {"spec", {{"schedulerName", scheduler}, {"containers", {{{"name", "c"}}}}}}};
  };
  fake_->Put(pod("a", "p", "duet"));
  fake_->Put(pod("b", "p", "duet"));
  fake_->Put(pod("b", "other", "default-scheduler"));
  InformerOptions o = options_;
  o.path = "/api/v1/pods";
  o.field_selector = "spec.schedulerName=duet";
  KeyRecorder rec;
  Informer pods(client_.get(), o, &rec);
  ASSERT_TRUE(pods.Start().ok());
  EXPECT_EQ(rec.keys(), (std::set<std::string>{"a/p", "b/p"}));
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  fake_->Delete("Pod", "p", "a");
  fake_->Put(pod("c", "q", "duet"));
  ASSERT_TRUE(WaitFor([&] { return rec.keys() == std::set<std::string>{"b/p", "c/q"}; }));
  // Through a relist as well.
  fake_->Control("fail", {{"count", 1000000}});
  fake_->Control("drop");
  fake_->Delete("Pod", "p", "b");
  fake_->Control("compact");
  fake_->Control("fail", {{"count", 0}});
  ASSERT_TRUE(WaitFor([&] { return rec.keys() == std::set<std::string>{"c/q"}; }));
  EXPECT_EQ(pods.stats().lists, 2u);
  pods.Stop();
}

TEST_F(InformerTest, StopIsPromptAndFinal) {
  Make();
  StartInformer();
  ASSERT_TRUE(WaitFor([&] { return fake_->OpenWatches() == 1; }));
  const absl::Time t0 = absl::Now();
  informer_->Stop();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  informer_->Stop();  // idempotent
  const int syncs = mirror_.syncs();
  // A second informer is the witness: once it has the node, the server has
  // sent it to every open watch.
  Mirror witness;
  Informer second(client_.get(), options_, &witness);
  ASSERT_TRUE(second.Start().ok());
  fake_->Put(Node("after"));
  ASSERT_TRUE(WaitFor([&] { return witness.names().count("after") == 1; }));
  second.Stop();
  EXPECT_EQ(mirror_.names().count("after"), 0u);
  EXPECT_EQ(mirror_.syncs(), syncs);
}

// A KubeClient that answers each Get and Stream with the next scripted reply
// (a body, or an error status); out of replies, a watch stays open until
// Close() and a Get fails.
class ScriptedClient : public KubeClient {
 public:
  struct Reply {
    absl::Status status;
    std::string body;  // Get: the body; Stream: frames, one per line
  };
  explicit ScriptedClient(std::vector<Reply> replies) : replies_(replies.begin(), replies.end()) {}
  absl::StatusOr<std::string> Get(const std::string&) override {
    Reply r = Next();
    if (!r.status.ok()) return r.status;
    return r.body;
  }
  absl::StatusOr<std::string> Post(const std::string&, const std::string&) override { return No(); }
  absl::StatusOr<std::string> Put(const std::string&, const std::string&) override { return No(); }
  absl::StatusOr<std::string> Patch(const std::string&, const std::string&, PatchType) override { return No(); }
  absl::StatusOr<std::string> Delete(const std::string&) override { return No(); }
  absl::Status Stream(const std::string&, const StreamOptions&,
                      const std::function<absl::Status(absl::string_view)>& on_line) override {
    Reply r = Next();
    if (r.status.code() == absl::StatusCode::kAborted) {  // out of replies
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(&closed_));
      return absl::UnavailableError("closed");
    }
    if (!r.status.ok()) return r.status;
    for (absl::string_view line : absl::StrSplit(r.body, '\n', absl::SkipEmpty())) {
      absl::Status s = on_line(line);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  bool drained() {
    absl::MutexLock l(&mu_);
    return replies_.empty();
  }
  // Ends the open watch (as a connection that drops); call before the
  // informer's Stop().
  void Close() {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }

 private:
  static absl::Status No() { return absl::UnimplementedError("read only"); }
  Reply Next() {
    absl::MutexLock l(&mu_);
    if (replies_.empty()) return {absl::AbortedError("no reply left"), ""};
    Reply r = replies_.front();
    replies_.pop_front();
    return r;
  }
  absl::Mutex mu_;
  std::deque<Reply> replies_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

std::string ListPage(const std::string& rv, const std::string& cont, const std::vector<std::string>& names) {
  nlohmann::json page = {{"metadata", {{"resourceVersion", rv}}}, {"items", nlohmann::json::array()}};
  if (!cont.empty()) page["metadata"]["continue"] = cont;
  for (const std::string& n : names) {
    page["items"].push_back({{"metadata", {{"name", n}, {"resourceVersion", rv}}}});
  }
  return page.dump();
}

// A relist that fails after delivering its first page must not forget what
// that page delivered: when a later relist no longer has the object, its
// deletion is delivered (found by the informer fuzz target's review).
TEST(InformerScriptedTest, RelistFailingMidPagesStillDeliversLaterDeletions) {
  ScriptedClient client({
      {absl::OkStatus(), ListPage("1", "", {"a"})},                      // first list
      {StatusFromHttp(410, R"({"kind":"Status","code":410})"), ""},      // watch: Gone
      {absl::OkStatus(), ListPage("5", "next", {"a", "c"})},             // relist page 1: c is new
      {absl::UnavailableError("connection reset"), ""},                  // relist page 2 fails
      {absl::OkStatus(), ListPage("7", "", {"a"})},                      // relist: c is gone
  });
  Mirror mirror;
  InformerOptions o;
  o.path = "/api/v1/nodes";
  o.min_backoff = absl::Milliseconds(1);
  o.max_backoff = absl::Milliseconds(1);
  Informer informer(&client, o, &mirror);
  // Runs before the informer's destructor, on every way out of the test.
  auto close = absl::MakeCleanup([&] { client.Close(); });
  ASSERT_TRUE(informer.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return client.drained() && mirror.syncs() == 2; }));
  std::move(close).Invoke();
  informer.Stop();
  EXPECT_EQ(mirror.names(), std::set<std::string>{"a"});
  EXPECT_THAT(mirror.deletes(), ::testing::ElementsAre(std::make_pair(std::string("c"), false)));
}

}  // namespace
}  // namespace k8s
}  // namespace duet
