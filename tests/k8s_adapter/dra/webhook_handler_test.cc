// The webhook's routing and JSON layer without sockets: allowed and refused
// reviews, invalid bodies (the gate is not asked), paths, methods, metrics.

#include <mutex>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/dra/webhook.h"
#include "prometheus/text_serializer.h"
#include "tests/k8s_adapter/dra/review_fixture.h"

namespace duet {
namespace k8s_dra {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

class StubGate : public dra::AdmissionGate {
 public:
  dra::AdmissionVerdict Review(const dra::AdmissionAsk& ask) override {
    std::lock_guard<std::mutex> lock(mu);
    asks.push_back(ask);
    return verdict;
  }
  std::mutex mu;
  std::vector<dra::AdmissionAsk> asks;
  dra::AdmissionVerdict verdict{true, "", ""};
};

TEST(WebhookHandlerTest, AllowsRefusesAndCounts) {
  StubGate gate;
  prometheus::Registry registry;
  WebhookHandler h(&gate, &registry);
  http::HttpReply r = h.Handle("POST", "/validate-resourceclaim-status?timeout=10s",
                               testing::Review().dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json answer = json::parse(r.body);
  EXPECT_EQ(answer["response"]["uid"], "review-uid-7");
  EXPECT_EQ(answer["response"]["allowed"], true);
  ASSERT_EQ(gate.asks.size(), 1u);
  EXPECT_EQ(gate.asks[0].node, "gpu-node-1");

  gate.verdict = {false, "RECLAIMING", "gpu.nvidia.com/gpu-node-1/gpu-3 is being reclaimed"};
  r = h.Handle("POST", kAdmissionPath, testing::Review().dump());
  ASSERT_EQ(r.status, 200);
  answer = json::parse(r.body);
  EXPECT_EQ(answer["response"]["allowed"], false);
  EXPECT_EQ(answer["response"]["status"]["reason"], "RECLAIMING");
  EXPECT_EQ(answer["response"]["status"]["code"], 403);

  json pods = testing::Review();
  pods["request"]["resource"]["resource"] = "pods";
  r = h.Handle("POST", kAdmissionPath, pods.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("request.resource"));
  EXPECT_EQ(h.Handle("POST", kAdmissionPath, "not json").status, 400);
  EXPECT_EQ(gate.asks.size(), 2u);  // invalid reviews never reach the gate

  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("duet_dra_webhook_requests_total{result=\"allowed\"} 1"));
  EXPECT_THAT(text, HasSubstr("duet_dra_webhook_requests_total{result=\"denied\"} 1"));
  EXPECT_THAT(text, HasSubstr("duet_dra_webhook_requests_total{result=\"invalid\"} 2"));
  EXPECT_THAT(text, HasSubstr("duet_dra_webhook_seconds_count 4"));
}

TEST(WebhookHandlerTest, PathsAndMethods) {
  StubGate gate;
  WebhookHandler h(&gate, nullptr);
  EXPECT_EQ(h.Handle("GET", "/healthz", "").status, 200);
  EXPECT_EQ(h.Handle("GET", "/other", "").status, 404);
  http::HttpReply r = h.Handle("GET", kAdmissionPath, "");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.allow, "POST");
  EXPECT_EQ(h.Handle("POST", "/healthz", "").status, 405);
  EXPECT_TRUE(gate.asks.empty());
}

}  // namespace
}  // namespace k8s_dra
}  // namespace duet
