// The journal over a faulty file layer (bridge/journal/file_layer.h): a disk
// that fails an fdatasync or a write. A grant whose record cannot be made
// durable is refused (WaitDurable: UNAVAILABLE, naming the failed call), the
// journal stays failed, and after a crash a restart recovers exactly the
// holdings that were acknowledged (I3) and nothing that was refused.
//
// The faulty layer models the crash as leveldb's fault-injection test does:
// what no successful sync confirmed is lost (DropUnsyncedData).

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "bridge/journal/fault_file_layer.h"
#include "bridge/journal/file_layer.h"
#include "bridge/journal/journal.h"
#include "bridge/ledger/ledger.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The real files, with failures switched on by the test: every sync or
// append of a file whose path contains `fail_in` fails with `err`. It keeps,
// per file, how much a successful sync has confirmed.
class FaultyFiles final : public ForwardingFileLayer {
 public:
  FaultyFiles() : ForwardingFileLayer(FileLayer::Posix()) {}
  void FailSyncs(const std::string& fail_in, int err) {
    absl::MutexLock lock(&mu_);
    sync_fail_in_ = fail_in;
    sync_errno_ = err;
  }
  void FailAppends(const std::string& fail_in, int err) {
    absl::MutexLock lock(&mu_);
    append_fail_in_ = fail_in;
    append_errno_ = err;
  }
  void Heal() {
    absl::MutexLock lock(&mu_);
    sync_errno_ = append_errno_ = 0;
  }
  int failed_calls() const {
    absl::MutexLock lock(&mu_);
    return failed_calls_;
  }
  // The crash: each file written through this layer is cut back to what its
  // last successful sync confirmed.
  void DropUnsyncedData() {
    absl::MutexLock lock(&mu_);
    for (const auto& [path, synced] : synced_) {
      std::error_code ec;
      if (fs::exists(path, ec)) fs::resize_file(path, synced, ec);
      EXPECT_FALSE(ec) << path << ": " << ec.message();
    }
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> f = real()->NewWritableFile(path);
    if (!f.ok()) return f.status();
    absl::MutexLock lock(&mu_);
    synced_[path] = 0;
    return std::unique_ptr<WritableFile>(new File(this, *std::move(f)));
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    absl::Status s = real()->Rename(from, to);
    absl::MutexLock lock(&mu_);
    if (s.ok() && synced_.count(from)) {
      synced_[to] = synced_[from];
      synced_.erase(from);
    }
    return s;
  }
  absl::Status Remove(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    synced_.erase(path);
    return real()->Remove(path);
  }

 private:
  class File final : public WritableFile {
   public:
    File(FaultyFiles* layer, std::unique_ptr<WritableFile> real)
        : layer_(layer), real_(std::move(real)) {}
    absl::Status Append(absl::string_view data) override {
      if (int err = layer_->Fails(path(), /*sync=*/false); err != 0) {
        return absl::UnavailableError(absl::StrCat("write ", path(), ": ", strerror(err)));
      }
      DUET_RETURN_IF_ERROR(real_->Append(data));
      written_ += data.size();
      return absl::OkStatus();
    }
    absl::Status SyncData() override { return DoSync("fdatasync", /*data_only=*/true); }
    absl::Status Sync() override { return DoSync("fsync", /*data_only=*/false); }
    const std::string& path() const override { return real_->path(); }

   private:
    absl::Status DoSync(const char* call, bool data_only) {
      if (int err = layer_->Fails(path(), /*sync=*/true); err != 0) {
        // Like Linux after a failed fsync: the data may sit in the page cache,
        // but nothing confirms it is on the disk.
        return absl::UnavailableError(absl::StrCat(call, " ", path(), ": ", strerror(err)));
      }
      DUET_RETURN_IF_ERROR(data_only ? real_->SyncData() : real_->Sync());
      absl::MutexLock lock(&layer_->mu_);
      layer_->synced_[path()] = written_;
      return absl::OkStatus();
    }
    FaultyFiles* const layer_;
    const std::unique_ptr<WritableFile> real_;
    uint64_t written_ = 0;
  };

  int Fails(const std::string& path, bool sync) {
    absl::MutexLock lock(&mu_);
    const int err = sync ? sync_errno_ : append_errno_;
    const std::string& in = sync ? sync_fail_in_ : append_fail_in_;
    if (err == 0 || !absl::StrContains(path, in)) return 0;
    ++failed_calls_;
    return err;
  }

  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> synced_ ABSL_GUARDED_BY(mu_);
  std::string sync_fail_in_ ABSL_GUARDED_BY(mu_);
  int sync_errno_ ABSL_GUARDED_BY(mu_) = 0;
  std::string append_fail_in_ ABSL_GUARDED_BY(mu_);
  int append_errno_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "journal_fault_test.XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

NodeSpec MakeNode() {
  NodeSpec spec;
  spec.name = "gke-a";
  spec.cpus = 64;
  spec.memory_mib = 512 * 1024;
  for (uint32_t i = 0; i < 8; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.id = absl::StrCat("GPU-", i);
    d.model = "h100";
    spec.devices.push_back(d);
  }
  return spec;
}

Journal::Options Opts(const std::string& dir, FileLayer* files) {
  Journal::Options o;
  o.dir = dir;
  o.fsync = true;
  o.snapshot_every = 0;
  o.files = files;
  return o;
}

// Holds gpu `index` for `owner` and waits for its record to be durable: the
// status a caller of the bridge would be answered with.
absl::Status Grant(Ledger* ledger, Journal* journal, const Owner& owner, uint32_t index) {
  HoldRequest r;
  r.node = "gke-a";
  r.owner = owner;
  r.devices.push_back({DeviceKind::kGpu, index, kWholeDevice});
  absl::StatusOr<HoldResult> h = ledger->Hold(r);
  if (!h.ok()) return h.status();
  return journal->WaitDurable(h->seq);
}

// (owner, first device) of every holding, sorted: what a restart recovered.
std::vector<std::string> Holdings(const Ledger& ledger) {
  std::vector<std::string> out;
  for (const Holding& h : ledger.ListHoldings()) {
    out.push_back(absl::StrCat(h.owner.ToString(), " gpu ", h.devices.at(0).index));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> Recover(const std::string& dir) {
  Ledger ledger;
  absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(Opts(dir, nullptr), &ledger);
  EXPECT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  return Holdings(ledger);
}

TEST(JournalFaultTest, FsyncFailureRefusesTheGrantAndARestartRecoversExactlyTheAcknowledged) {
  TempDir dir;
  FaultyFiles files;
  {
    Ledger ledger;
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(Opts(dir.path(), &files), &ledger);
    ASSERT_TRUE(j.ok()) << j.status();
    Journal* journal = j->get();
    absl::StatusOr<uint64_t> up = ledger.UpsertNode(MakeNode());
    ASSERT_TRUE(up.ok());
    ASSERT_TRUE(journal->WaitDurable(*up).ok());
    ASSERT_TRUE(Grant(&ledger, journal, Owner::SlurmJob(1), 0).ok());
    ASSERT_TRUE(Grant(&ledger, journal, Owner::Pod("uid-a", "default", "a"), 1).ok());

    // The disk starts failing fdatasync on the log.
    files.FailSyncs("/wal-", EIO);
    absl::Status refused = Grant(&ledger, journal, Owner::SlurmJob(2), 2);
    EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("journal cannot persist changes"));
    EXPECT_THAT(std::string(refused.message()), HasSubstr("fdatasync"));
    EXPECT_THAT(std::string(refused.message()), HasSubstr(strerror(EIO)));
    EXPECT_TRUE(absl::IsUnavailable(journal->Health()));
    EXPECT_GE(files.failed_calls(), 1);

    // Failed for good: nothing later is acknowledged, even once the disk
    // would work again.
    files.Heal();
    EXPECT_TRUE(absl::IsUnavailable(Grant(&ledger, journal, Owner::SlurmJob(3), 3)));
    EXPECT_TRUE(absl::IsUnavailable(journal->Flush()));
  }
  files.DropUnsyncedData();
  EXPECT_EQ(Recover(dir.path()),
            (std::vector<std::string>{"pod default/a (uid uid-a) gpu 1", "slurm job 1 gpu 0"}));
}

TEST(JournalFaultTest, WriteFailureRefusesTheGrantAndARestartRecoversExactlyTheAcknowledged) {
  TempDir dir;
  FaultyFiles files;
  {
    Ledger ledger;
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(Opts(dir.path(), &files), &ledger);
    ASSERT_TRUE(j.ok()) << j.status();
    Journal* journal = j->get();
    absl::StatusOr<uint64_t> up = ledger.UpsertNode(MakeNode());
    ASSERT_TRUE(up.ok());
    ASSERT_TRUE(journal->WaitDurable(*up).ok());
    ASSERT_TRUE(Grant(&ledger, journal, Owner::SlurmJob(1), 0).ok());

    files.FailAppends("/wal-", ENOSPC);
    absl::Status refused = Grant(&ledger, journal, Owner::SlurmJob(2), 1);
    EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(strerror(ENOSPC)));
  }
  files.DropUnsyncedData();
  EXPECT_EQ(Recover(dir.path()), (std::vector<std::string>{"slurm job 1 gpu 0"}));
}

// A snapshot that cannot be synced is not put in place; the log still holds
// everything, and the journal keeps serving.
TEST(JournalFaultTest, SnapshotSyncFailureLeavesTheLogInCharge) {
  TempDir dir;
  FaultyFiles files;
  {
    Ledger ledger;
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(Opts(dir.path(), &files), &ledger);
    ASSERT_TRUE(j.ok()) << j.status();
    Journal* journal = j->get();
    ASSERT_TRUE(ledger.UpsertNode(MakeNode()).ok());
    ASSERT_TRUE(Grant(&ledger, journal, Owner::SlurmJob(1), 0).ok());
    files.FailSyncs("/snapshot-", EIO);
    absl::Status snap = journal->WriteSnapshot();
    EXPECT_TRUE(absl::IsUnavailable(snap)) << snap;
    EXPECT_THAT(std::string(snap.message()), HasSubstr("fsync"));
    files.Heal();
    EXPECT_TRUE(journal->Health().ok());
    ASSERT_TRUE(Grant(&ledger, journal, Owner::SlurmJob(2), 1).ok());
  }
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_FALSE(absl::StrContains(e.path().filename().string(), "snapshot-")) << e.path();
  }
  files.DropUnsyncedData();
  EXPECT_EQ(Recover(dir.path()), (std::vector<std::string>{"slurm job 1 gpu 0", "slurm job 2 gpu 1"}));
}

// The seam duet-bridge installs for soak runs (DUET_TEST_JOURNAL_FAULT_FILE):
// a control file switches write failures (ENOSPC) and fdatasync failures (EIO)
// on and off; with it absent the journal works as on the real files.
TEST(JournalFaultTest, ControlFileLayerFailsWritesOrSyncsWhileTheFileSaysSo) {
  for (const char* word : {"ENOSPC", "EIO"}) {
    SCOPED_TRACE(word);
    TempDir dir;
    const std::string control = dir.path() + "/fault";
    std::unique_ptr<FileLayer> files = NewControlFileFaultLayer(FileLayer::Posix(), control);
    {
      Ledger ledger;
      absl::StatusOr<std::unique_ptr<Journal>> j =
          Journal::Open(Opts(dir.path() + "/journal", files.get()), &ledger);
      ASSERT_TRUE(j.ok()) << j.status();
      Journal* journal = j->get();
      absl::StatusOr<uint64_t> up = ledger.UpsertNode(MakeNode());
      ASSERT_TRUE(up.ok());
      ASSERT_TRUE(journal->WaitDurable(*up).ok());
      ASSERT_TRUE(Grant(&ledger, journal, Owner::SlurmJob(1), 0).ok());

      std::ofstream(control) << word << "\n";
      absl::Status refused = Grant(&ledger, journal, Owner::SlurmJob(2), 2);
      EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
      EXPECT_THAT(std::string(refused.message()),
                  HasSubstr(std::string(word) == "EIO" ? "fdatasync" : "write "));
      EXPECT_THAT(std::string(refused.message()),
                  HasSubstr(strerror(std::string(word) == "EIO" ? EIO : ENOSPC)));
      fs::remove(control);
      // Failed for good, as on a real disk.
      EXPECT_TRUE(absl::IsUnavailable(Grant(&ledger, journal, Owner::SlurmJob(3), 3)));
    }
    const std::vector<std::string> recovered = Recover(dir.path() + "/journal");
    // Acknowledged: job 1. Refused: job 3 (never written). Job 2's record may
    // have reached the file before its fdatasync failed (EIO), never with ENOSPC.
    EXPECT_TRUE(std::find(recovered.begin(), recovered.end(), "slurm job 1 gpu 0") !=
                recovered.end());
    EXPECT_TRUE(std::find(recovered.begin(), recovered.end(), "slurm job 3 gpu 3") ==
                recovered.end());
    if (std::string(word) == "ENOSPC") {
      EXPECT_EQ(recovered, std::vector<std::string>{"slurm job 1 gpu 0"});
    }
  }
}

// The fault layers pass the directory lock through (ForwardingFileLayer): a
// journal opened through one still keeps every other opener out, and the
// other way round.
TEST(JournalFaultTest, TheFaultLayersKeepTheDirectoryLock) {
  TempDir dir;
  FaultyFiles faulty;
  std::unique_ptr<FileLayer> control =
      NewControlFileFaultLayer(FileLayer::Posix(), dir.path() + "/fault");
  for (FileLayer* holder : {static_cast<FileLayer*>(&faulty), control.get()}) {
    for (FileLayer* other : {static_cast<FileLayer*>(&faulty), control.get(),
                             static_cast<FileLayer*>(nullptr)}) {
      Ledger held_ledger;
      absl::StatusOr<std::unique_ptr<Journal>> held =
          Journal::Open(Opts(dir.path() + "/journal", holder), &held_ledger);
      ASSERT_TRUE(held.ok()) << held.status();
      Ledger other_ledger;
      absl::StatusOr<std::unique_ptr<Journal>> refused =
          Journal::Open(Opts(dir.path() + "/journal", other), &other_ledger);
      EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
      EXPECT_THAT(std::string(refused.status().message()), HasSubstr("/journal/LOCK held by pid "));
    }
  }
}

}  // namespace
}  // namespace duet
