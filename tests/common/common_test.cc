// The shared leaf (common/): each helper as every binary relies on it.

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/device/device.h"
#include "common/enum_name.h"
#include "common/file.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/metrics/metrics.h"
#include "common/reason.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"

namespace duet {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string TempFile(const std::string& content) {
  char path[] = "/tmp/duet-common-test-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(ReadFileToString, ReadsEveryByte) {
  const std::string content("a\0b\ncert", 8);
  const std::string path = TempFile(content);
  absl::StatusOr<std::string> got = ReadFileToString(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, content);
  std::remove(path.c_str());
}

TEST(ReadFileToString, AMissingFileNamesTheFileTheFieldAndWhy) {
  absl::StatusOr<std::string> got = ReadFileToString("/nonexistent/ca.pem");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.status().message(), "cannot read /nonexistent/ca.pem: No such file or directory");
  got = ReadFileToString("/nonexistent/ca.pem", absl::StatusCode::kInvalidArgument, "--ca-file");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              StartsWith("--ca-file: cannot read /nonexistent/ca.pem: "));
  // A directory opens but cannot be read as a file.
  got = ReadFileToString("/tmp");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
}

TEST(GrpcStatus, AReasonSurvivesTheWireBothWays) {
  const absl::Status refused = WithReason(absl::FailedPreconditionError("pod holds gpu 3"),
                                          "DEVICE_HELD", {{"node", "gke-a"}, {"device", "3"}});
  const grpc::Status wire = ToGrpc(refused);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(wire.error_message(), "pod holds gpu 3");
  EXPECT_FALSE(wire.error_details().empty());

  const absl::Status back = FromGrpc(wire, "Hold");
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "Hold: pod holds gpu 3");
  EXPECT_EQ(ReasonOf(back), "DEVICE_HELD");
  EXPECT_EQ(ReasonMetadata(back),
            (std::map<std::string, std::string>{{"node", "gke-a"}, {"device", "3"}}));
}

TEST(GrpcStatus, PlainStatusesStayPlain) {
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpc(grpc::Status::OK, "Hold").ok());
  const grpc::Status wire = ToGrpc(absl::NotFoundError("no node x"));
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(wire.error_details().empty());
  const absl::Status back =
      FromGrpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"), "ListHoldings");
  EXPECT_EQ(back.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(back.message(), "ListHoldings: connection refused");
  EXPECT_EQ(ReasonOf(back), "");
}

TEST(Tls, NoServerCertificateMeansInsecure) {
  auto creds = TlsServerCredentials({"", "grpc.tls.cert_file"}, {"", "grpc.tls.key_file"},
                                    {"", "grpc.tls.client_ca_file"});
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_NE(*creds, nullptr);
}

TEST(Tls, AnUnreadableFileNamesItsField) {
  const std::string cert = TempFile("not really a certificate");
  auto server = TlsServerCredentials({cert, "grpc.tls.cert_file"},
                                     {"/nonexistent/server.key", "grpc.tls.key_file"},
                                     {"", "grpc.tls.client_ca_file"});
  EXPECT_EQ(server.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(server.status().message()),
              StartsWith("grpc.tls.key_file: cannot read /nonexistent/server.key"));

  auto client = TlsChannelCredentials({"/nonexistent/ca.pem", "--ca-file"}, {"", "--cert-file"},
                                      {"", "--key-file"}, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()),
              StartsWith("--ca-file: cannot read /nonexistent/ca.pem"));
  client = TlsChannelCredentials({cert, "--bridge-ca"}, {"/nonexistent/c.crt", "--bridge-cert"},
                                 {"", "--bridge-key"});
  EXPECT_EQ(client.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("--bridge-cert: cannot read"));
  // Roots alone: TLS without a client certificate.
  client = TlsChannelCredentials({cert, "--bridge-ca"}, {"", "--bridge-cert"}, {"", "--bridge-key"});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_NE(*client, nullptr);
  std::remove(cert.c_str());
}

TEST(Metrics, FamiliesTakeTheValueOfTheirType) {
  prometheus::MetricFamily c = NewFamily("x_total", "help", prometheus::MetricType::Counter);
  AddValue(&c, {{"result", "ok"}}, 3);
  ASSERT_EQ(c.metric.size(), 1u);
  EXPECT_EQ(c.name, "x_total");
  EXPECT_EQ(c.metric[0].counter.value, 3);
  EXPECT_EQ(c.metric[0].label[0].value, "ok");
  prometheus::MetricFamily g = NewFamily("x", "help", prometheus::MetricType::Gauge);
  AddValue(&g, {}, -1);
  EXPECT_EQ(g.metric[0].gauge.value, -1);
  EXPECT_EQ(g.metric[0].counter.value, 0);
}

TEST(Metrics, RegisterFamilyNamesAndDescribesIt) {
  prometheus::Registry registry;
  prometheus::Family<prometheus::Counter>& f =
      RegisterFamily(prometheus::BuildCounter(), registry, "y_total", "what y counts");
  f.Add({{"result", "ok"}}).Increment(2);
  const std::vector<prometheus::MetricFamily> all = registry.Collect();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "y_total");
  EXPECT_EQ(all[0].help, "what y counts");
  EXPECT_EQ(all[0].type, prometheus::MetricType::Counter);
  ASSERT_EQ(all[0].metric.size(), 1u);
  EXPECT_EQ(all[0].metric[0].counter.value, 2);
}

TEST(Metrics, ABusyPortIsUnavailableAndNamed) {
  auto first = ServeMetrics("metrics.listen", "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const auto ports = (*first)->GetListeningPorts();
  ASSERT_EQ(ports.size(), 1u);
  const std::string taken = "127.0.0.1:" + std::to_string(ports[0]);
  auto second = ServeMetrics("--metrics-listen", taken);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              StartsWith("--metrics-listen " + taken + ": cannot serve /metrics: "));
}

TEST(EnumName, TheTableSlotOrUnknown) {
  enum class Color { kRed, kGreen, kBlue };
  static constexpr const char* kNames[] = {"red", "green"};
  EXPECT_STREQ(EnumName(Color::kRed, kNames), "red");
  EXPECT_STREQ(EnumName(Color::kGreen, kNames), "green");
  EXPECT_STREQ(EnumName(Color::kBlue, kNames), "unknown");  // past the table
  EXPECT_STREQ(EnumName(Color::kBlue, kNames, "-"), "-");
  static constexpr const char* kFromOne[] = {nullptr, "one"};  // 0 is no value
  EXPECT_STREQ(EnumName(0, kFromOne), "unknown");
  EXPECT_STREQ(EnumName(1, kFromOne), "one");
  EXPECT_STREQ(EnumName(-1, kFromOne), "unknown");
}

TEST(Device, KindNamesAndTheEnvironmentOfEachKind) {
  EXPECT_STREQ(DeviceKindName(DeviceKind::kGpu), "gpu");
  EXPECT_STREQ(DeviceKindName(DeviceKind::kTpu), "tpu");
  HostDevices d;
  d.gpus = {1, 5};
  d.tpus = {0, 1};
  using Env = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(DeviceEnv(d), (Env{{"CUDA_VISIBLE_DEVICES", "1,5"},
                               {"TPU_VISIBLE_CHIPS", "0,1"},
                               {"TPU_CHIPS_PER_PROCESS_BOUNDS", "1,2,1"},
                               {"TPU_PROCESS_BOUNDS", "1,1,1"}}));
  EXPECT_EQ(TpuChipBounds(4), "2,2,1");
  EXPECT_EQ(TpuChipBounds(3), "1,3,1");
  EXPECT_TRUE(DeviceEnv(HostDevices{}).empty());
}

}  // namespace
}  // namespace duet
