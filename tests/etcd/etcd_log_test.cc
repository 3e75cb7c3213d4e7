// EtcdLog against a real etcd (tests/etcd/etcd_server.h): records durable and
// recovered by a fresh log, snapshot + compaction, batches beyond etcd's
// 128-operation transactions, fencing of a deposed writer, and etcd down.

#include "bridge/etcd/etcd_log.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bridge/etcd/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd/etcd_server.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace {

using ::testing::HasSubstr;
using testing::EtcdServer;

NodeSpec MakeNode(const std::string& name, int gpus = 8) {
  NodeSpec spec;
  spec.name = name;
  spec.cpus = 64;
  spec.memory_mib = 512 * 1024;
  spec.pool = "a3";
  spec.zone = "us-central1-a";
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = static_cast<uint32_t>(i);
    d.id = absl::StrCat("GPU-", name, "-", i);
    d.model = "nvidia-h100-80gb";
    spec.devices.push_back(d);
  }
  return spec;
}

HoldRequest HoldCount(const std::string& node, const Owner& owner, uint32_t count,
                      uint32_t milli = 0) {
  HoldRequest r;
  r.node = node;
  r.owner = owner;
  r.count = CountSelector{DeviceKind::kGpu, count, milli, ""};
  return r;
}

// Everything a client can see, as comparable strings. A holding's own
// generation is renumbered when a snapshot is restored (the node's is not),
// so `holding_generations` is off where a snapshot is read.
std::vector<std::string> Dump(const Ledger& ledger, bool holding_generations = true) {
  std::vector<std::string> out;
  for (const auto& v : ledger.Snapshot().nodes) {
    std::string s = absl::StrCat(v->spec.name, "|", NodeStateName(v->spec.state), "|g",
                                 v->generation);
    for (const DeviceState& d : v->devices) absl::StrAppend(&s, "|", d.spec.index, ":", d.used_milli);
    out.push_back(s);
  }
  for (const Holding& h : ledger.ListHoldings()) {
    std::string s = absl::StrCat(h.node, "|", h.owner.ToString(), "|",
                                 absl::FormatTime(h.granted_at), "|g",
                                 holding_generations ? h.generation : 0, "|");
    for (const HeldDevice& d : h.devices) absl::StrAppend(&s, d.index, "@", d.milli, ",");
    out.push_back(s);
  }
  return out;
}

// What differs between two dumps (short, for failure messages).
std::string Diff(const std::vector<std::string>& got, const std::vector<std::string>& want) {
  std::string out;
  int n = 0;
  for (const auto& g : got) {
    if (std::find(want.begin(), want.end(), g) == want.end() && n++ < 5) out += "\n+ " + g;
  }
  for (const auto& w : want) {
    if (std::find(got.begin(), got.end(), w) == got.end() && n++ < 10) out += "\n- " + w;
  }
  return out;
}

// Random holds (whole devices and shares) and releases on `nodes` nodes.
void Churn(Ledger* ledger, int nodes, int changes, uint32_t seed, uint32_t* next_owner) {
  std::mt19937 rng(seed);
  for (int i = 0; i < changes; ++i) {
    const std::string node = absl::StrCat("node-", rng() % static_cast<uint32_t>(nodes));
    if (rng() % 100 < 60) {
      const uint32_t n = (*next_owner)++;
      Owner owner = n % 2 == 0 ? Owner::Pod(absl::StrCat("uid-", n), "default", "p")
                               : Owner::SlurmJob(n);
      (void)ledger->Hold(HoldCount(node, owner, 1, n % 3 == 0 ? 250 : 0));
    } else {
      std::vector<Holding> held = ledger->ListHoldings(node);
      if (!held.empty()) (void)ledger->Release(node, held[rng() % held.size()].owner);
    }
  }
}

class EtcdLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdServer::Available()) {
      GTEST_SKIP() << EtcdServer::kBinary << " is missing (Debian package etcd-server)";
    }
    ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Log();
  }

  EtcdLog::Options Opts(const std::string& owner = "test") {
    EtcdLog::Options o;
    o.endpoints = {etcd_.endpoint()};
    o.prefix = "/duet/test";
    o.owner = owner;
    o.snapshot_every = 0;
    o.request_timeout = absl::Seconds(2);
    o.commit_timeout = absl::Seconds(5);
    return o;
  }
  std::unique_ptr<EtcdLog> MustOpen(const EtcdLog::Options& o, Ledger* ledger) {
    auto log = EtcdLog::Open(o, ledger);
    EXPECT_TRUE(log.ok()) << log.status();
    return log.ok() ? std::move(log).value() : nullptr;
  }
  // Keys under `from` in etcd now.
  std::vector<std::string> Keys(const std::string& from) {
    etcd::Client c({{etcd_.endpoint()}, absl::Seconds(2), {}});
    auto r = c.Range(from, etcd::PrefixEnd(from), 0, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::string> keys;
    if (r.ok()) for (const auto& kv : r->kvs) keys.push_back(kv.key);
    return keys;
  }

  EtcdServer etcd_;
};

TEST_F(EtcdLogTest, DurableRecordsAreRecoveredByAFreshLog) {
  Ledger ledger;
  std::vector<std::string> before;
  {
    auto log = MustOpen(Opts(), &ledger);
    ASSERT_NE(log, nullptr);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(ledger.UpsertNode(MakeNode(absl::StrCat("node-", i))).ok());
    uint32_t next = 1;
    Churn(&ledger, 4, 300, 7, &next);
    ASSERT_GT(ledger.holding_count(), 0u);
    // Acknowledged: every change is in etcd before WaitDurable returns.
    ASSERT_TRUE(log->WaitDurable(ledger.seq()).ok());
    EXPECT_EQ(log->stats().durable_seq, ledger.seq());
    before = Dump(ledger);
    // The records are keys of their own.
    EXPECT_EQ(Keys("/duet/test/log/").size(), ledger.seq());
  }
  Ledger fresh;
  auto log = MustOpen(Opts(), &fresh);
  ASSERT_NE(log, nullptr);
  EXPECT_TRUE(Dump(fresh) == before) << Diff(Dump(fresh), before);
  EXPECT_EQ(fresh.seq(), ledger.seq());
  EXPECT_EQ(log->stats().recovered_records, ledger.seq());
  // It goes on from there.
  auto held = fresh.Hold(HoldCount("node-0", Owner::SlurmJob(99999), 1, 100));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(log->WaitDurable(held->seq).ok());
}

TEST_F(EtcdLogTest, SnapshotCompactsTheLogAndRecoveryReadsSnapshotThenLog) {
  EtcdLog::Options o = Opts();
  o.max_txn_ops = 8;  // the snapshot takes several transactions
  o.snapshot_value_bytes = 16 << 10;
  Ledger ledger;
  uint64_t snapshot_seq = 0;
  std::vector<std::string> before;
  {
    auto log = MustOpen(o, &ledger);
    ASSERT_NE(log, nullptr);
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(ledger.UpsertNode(MakeNode(absl::StrCat("node-", i), 64)).ok());
    }
    uint32_t next = 1;
    Churn(&ledger, 40, 1500, 11, &next);
    ASSERT_TRUE(log->Flush().ok());
    ASSERT_TRUE(log->WriteSnapshot().ok());
    snapshot_seq = ledger.seq();
    // Covered records are gone; the snapshot spans several values.
    EXPECT_TRUE(Keys("/duet/test/log/").empty());
    EXPECT_GT(Keys("/duet/test/snap/").size(), 2u);
    Churn(&ledger, 40, 200, 12, &next);  // after the snapshot: in the log
    ASSERT_TRUE(log->Flush().ok());
    ASSERT_TRUE(log->WriteSnapshot().ok());  // a second one replaces the first
    for (const std::string& k : Keys("/duet/test/snap/")) {
      EXPECT_THAT(k, HasSubstr(absl::StrFormat("/%020d/", ledger.seq())));
    }
    Churn(&ledger, 40, 200, 13, &next);
    ASSERT_TRUE(log->Flush().ok());
    EXPECT_EQ(log->stats().snapshots, 2u);
    before = Dump(ledger, false);
  }
  EXPECT_GT(ledger.seq(), snapshot_seq);
  Ledger fresh;
  auto log = MustOpen(o, &fresh);
  ASSERT_NE(log, nullptr);
  EXPECT_TRUE(Dump(fresh, false) == before) << Diff(Dump(fresh, false), before);
  EXPECT_EQ(fresh.seq(), ledger.seq());
  EXPECT_GT(log->stats().recovered_records, 0u);
  EXPECT_LT(log->stats().recovered_records, ledger.seq() - snapshot_seq);
}

TEST_F(EtcdLogTest, AutomaticSnapshotAfterSnapshotEveryRecords) {
  EtcdLog::Options o = Opts();
  o.snapshot_every = 100;
  Ledger ledger;
  auto log = MustOpen(o, &ledger);
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(ledger.UpsertNode(MakeNode("node-0")).ok());
  uint32_t next = 1;
  Churn(&ledger, 1, 300, 3, &next);
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_TRUE(fakes::WaitFor([&] { return log->stats().snapshots > 0; }));
}

TEST_F(EtcdLogTest, BatchesBeyondEtcdsTransactionLimitAreSplit) {
  Ledger ledger;
  std::vector<std::string> before;
  {
    auto log = MustOpen(Opts(), &ledger);
    ASSERT_NE(log, nullptr);
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(ledger.UpsertNode(MakeNode(absl::StrCat("node-", i))).ok());
    // Far faster than etcd commits: the writer finds hundreds buffered.
    uint32_t next = 1;
    Churn(&ledger, 8, 3000, 5, &next);
    ASSERT_TRUE(log->Flush().ok()) << log->Health();
    const EtcdLog::Stats s = log->stats();
    EXPECT_GT(s.largest_batch, 128u) << "no batch needed splitting";
    EXPECT_GE(s.txns, s.batches + 1);
    before = Dump(ledger);
  }
  Ledger fresh;
  auto log = MustOpen(Opts(), &fresh);
  ASSERT_NE(log, nullptr);
  EXPECT_TRUE(Dump(fresh) == before) << Diff(Dump(fresh), before);
}

TEST_F(EtcdLogTest, BatchesAndSnapshotsBeyondEtcdsRequestSizeAreSplit) {
  // Node records of a few KiB each, several MiB in all: more than etcd's
  // default --max-request-bytes (1.5 MiB) in one batch and one snapshot.
  Ledger ledger;
  std::vector<std::string> before;
  size_t bytes = 0;
  {
    auto log = MustOpen(Opts(), &ledger);
    ASSERT_NE(log, nullptr);
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE(ledger.UpsertNode(MakeNode(absl::StrCat("node-", i), 256)).ok());
    }
    uint32_t next = 1;
    Churn(&ledger, 300, 500, 9, &next);
    ASSERT_TRUE(log->Flush().ok()) << log->Health();
    bytes = log->stats().bytes;
    ASSERT_TRUE(log->WriteSnapshot().ok());
    EXPECT_GE(Keys("/duet/test/snap/").size(), 8u);  // ~256 KiB values
    before = Dump(ledger, false);
  }
  EXPECT_GT(bytes, 3u << 20);
  Ledger fresh;
  auto log = MustOpen(Opts(), &fresh);
  ASSERT_NE(log, nullptr);
  EXPECT_TRUE(Dump(fresh, false) == before) << Diff(Dump(fresh, false), before);
}

TEST_F(EtcdLogTest, ADeposedWriterCommitsNothingAndAcknowledgesNothing) {
  Ledger old_ledger;
  auto old_log = MustOpen(Opts("old"), &old_ledger);
  ASSERT_NE(old_log, nullptr);
  ASSERT_TRUE(old_ledger.UpsertNode(MakeNode("node-0")).ok());
  auto kept = old_ledger.Hold(HoldCount("node-0", Owner::SlurmJob(1), 2));
  ASSERT_TRUE(kept.ok());
  ASSERT_TRUE(old_log->WaitDurable(kept->seq).ok());

  // Another replica takes over (it fences, then reads).
  Ledger new_ledger;
  auto new_log = MustOpen(Opts("new"), &new_ledger);
  ASSERT_NE(new_log, nullptr);
  ASSERT_EQ(new_ledger.ListHoldings().size(), 1u);

  // The old leader, alive but deposed, grants in memory: never acknowledged.
  auto late = old_ledger.Hold(HoldCount("node-0", Owner::SlurmJob(2), 6));
  ASSERT_TRUE(late.ok());
  const absl::Status s = old_log->WaitDurable(late->seq);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("deposed"));
  EXPECT_TRUE(old_log->deposed());
  EXPECT_FALSE(old_log->Health().ok());
  // ... and stays failed: nothing later is acknowledged either.
  auto later = old_ledger.Release("node-0", Owner::SlurmJob(1));
  ASSERT_TRUE(later.ok());
  EXPECT_FALSE(old_log->WaitDurable(later->seq).ok());

  // The new leader grants the same devices to someone else: no double grant
  // is ever durable.
  auto other = new_ledger.Hold(HoldCount("node-0", Owner::SlurmJob(3), 6));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(new_log->WaitDurable(other->seq).ok());
  new_log.reset();
  Ledger recovered;
  auto log = MustOpen(Opts("third"), &recovered);
  ASSERT_NE(log, nullptr);
  std::vector<std::string> owners;
  for (const Holding& h : recovered.ListHoldings()) owners.push_back(h.owner.ToString());
  EXPECT_EQ(owners.size(), 2u);
  EXPECT_EQ(recovered.ListHoldings("node-0").size(), 2u);
  for (const Holding& h : recovered.ListHoldings()) {
    EXPECT_NE(h.owner, Owner::SlurmJob(2)) << "the deposed writer's grant reached etcd";
  }
}

TEST_F(EtcdLogTest, EtcdDownFailsWaitDurableWithUnavailableAndAcknowledgesNothing) {
  EtcdLog::Options o = Opts();
  o.request_timeout = absl::Milliseconds(200);
  o.commit_timeout = absl::Seconds(1);
  Ledger ledger;
  auto log = MustOpen(o, &ledger);
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(ledger.UpsertNode(MakeNode("node-0")).ok());
  ASSERT_TRUE(log->Flush().ok());

  etcd_.Kill();
  auto held = ledger.Hold(HoldCount("node-0", Owner::SlurmJob(7), 1));
  ASSERT_TRUE(held.ok());
  const absl::Time t0 = absl::Now();
  const absl::Status s = log->WaitDurable(held->seq);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("commit_timeout"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_FALSE(log->deposed());
  EXPECT_EQ(log->Health().code(), absl::StatusCode::kUnavailable);
  log.reset();

  // Opening against a dead etcd fails the same way.
  Ledger other;
  auto dead = EtcdLog::Open(o, &other);
  EXPECT_EQ(dead.status().code(), absl::StatusCode::kUnavailable) << dead.status();

  // etcd back: the unacknowledged hold is not there.
  ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Log();
  Ledger fresh;
  auto back = MustOpen(o, &fresh);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(fresh.node_count(), 1u);
  EXPECT_EQ(fresh.holding_count(), 0u);
}

TEST(EtcdLogOptionsTest, RefusesBadOptions) {
  Ledger ledger;
  EtcdLog::Options o;
  EXPECT_EQ(EtcdLog::Open(o, &ledger).status().code(), absl::StatusCode::kInvalidArgument);
  o.endpoints = {"http://127.0.0.1:1"};
  o.prefix = "/duet/";
  EXPECT_THAT(EtcdLog::Open(o, &ledger).status().message(), HasSubstr("prefix"));
}

}  // namespace
}  // namespace duet
