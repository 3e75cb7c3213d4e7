#pragma once

// The journal's file operations, behind an interface (the seam leveldb's Env
// is), so that tests can put a faulty layer under a real journal: ENOSPC or
// EIO on a write, a failing fsync, a lost rename. The journal uses
// FileLayer::Posix() unless told otherwise (Journal::Options::files).
//
// Every failure is UNAVAILABLE with the operation and the path named
// ("fdatasync /var/lib/duet/journal/wal-...log: Input/output error"): to the
// journal every I/O failure means "cannot persist". The one exception is
// Lock's "someone else holds it", which is FAILED_PRECONDITION: nothing is
// wrong with the disk, the directory is in use.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet {

// A file open for writing. Not thread-safe: one user at a time.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all of `data` (retrying short writes).
  virtual absl::Status Append(absl::string_view data) = 0;
  // The data written so far is on disk (fdatasync).
  virtual absl::Status SyncData() = 0;
  // The data and the file's metadata are on disk (fsync).
  virtual absl::Status Sync() = 0;
  // The path it was opened with.
  virtual const std::string& path() const = 0;
};

// An exclusive lock taken by FileLayer::Lock; destroying it releases it.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

// Thread-safe: the journal's writer, snapshot and opening threads call it
// concurrently (never on the same file).
class FileLayer {
 public:
  virtual ~FileLayer() = default;

  // The real one (POSIX calls); lives for the whole process.
  static FileLayer* Posix();

  // Creates `dir` and its parents if missing.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // The names (not paths) of the entries of `dir`, in no order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // The whole file.
  virtual absl::Status ReadFile(const std::string& path, std::string* out) = 0;
  // Creates `path`, or empties an existing one, for appending.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Cuts `path` to `size` bytes; with `sync`, makes that durable.
  virtual absl::Status Truncate(const std::string& path, uint64_t size, bool sync) = 0;
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // Makes the directory's entries (created, renamed, removed files) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;

  // Takes an exclusive lock on `path` without waiting, held until the result
  // is destroyed. The file is created if missing and never truncated or
  // removed before the lock is held (its content names the current holder);
  // once held, its content is replaced by `holder`. Every Lock is its own
  // claim: a second Lock of the same file conflicts even in the same process.
  // Errors: FAILED_PRECONDITION when another claim holds the lock, with the
  // message "<path> held by <the first line of the file>"; UNAVAILABLE when
  // the file cannot be opened, locked (no lock support) or written.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                         absl::string_view holder) = 0;
};

// A FileLayer that passes every call to `real` (not owned; must outlive it):
// the base of layers that change a few calls (fault injection) and forward
// the rest.
class ForwardingFileLayer : public FileLayer {
 public:
  explicit ForwardingFileLayer(FileLayer* real) : real_(real) {}

  absl::Status CreateDir(const std::string& dir) override { return real_->CreateDir(dir); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return real_->ListDir(dir);
  }
  absl::Status ReadFile(const std::string& path, std::string* out) override {
    return real_->ReadFile(path, out);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return real_->NewWritableFile(path);
  }
  absl::Status Truncate(const std::string& path, uint64_t size, bool sync) override {
    return real_->Truncate(path, size, sync);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return real_->Rename(from, to);
  }
  absl::Status Remove(const std::string& path) override { return real_->Remove(path); }
  absl::Status SyncDir(const std::string& dir) override { return real_->SyncDir(dir); }
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 absl::string_view holder) override {
    return real_->Lock(path, holder);
  }

 protected:
  FileLayer* real() const { return real_; }

 private:
  FileLayer* const real_;
};

}  // namespace duet
