#include "bridge/journal/file_layer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(int err, absl::string_view op, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(op, " ", path, ": ", strerror(err)));
}

// Opens `path` with `flags`, flushes it with `sync` (fsync or fdatasync,
// named `sync_op` in errors) and closes it.
absl::Status OpenAndSync(const std::string& path, int flags, int (*sync)(int),
                         absl::string_view sync_op) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Errno(errno, "open", path);
  const int rc = sync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return Errno(err, sync_op, path);
  return absl::OkStatus();
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override { close(fd_); }

  absl::Status Append(absl::string_view data) override {
    const char* p = data.data();
    size_t n = data.size();
    while (n > 0) {
      const ssize_t w = write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Errno(errno, "write", path_);
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }
  absl::Status SyncData() override {
    if (fdatasync(fd_) != 0) return Errno(errno, "fdatasync", path_);
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    if (fsync(fd_) != 0) return Errno(errno, "fsync", path_);
    return absl::OkStatus();
  }
  const std::string& path() const override { return path_; }

 private:
  const int fd_;
  const std::string path_;
};

// A flock(2) lock. flock locks belong to the open file description, so the
// lock is held exactly as long as `fd_` is open, and any other open of the
// file (another process, or another Lock in this one) is refused.
class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { close(fd_); }

 private:
  const int fd_;
};

// Who holds the lock on the file open as `fd`: the first line of the file,
// as its holder wrote it once it had the lock. Empty in the instant between
// the holder's lock and its write (or if it crashed then).
std::string LockHolder(int fd) {
  char buf[256];
  ssize_t n;
  do {
    n = pread(fd, buf, sizeof(buf), 0);
  } while (n < 0 && errno == EINTR);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  text = text.substr(0, text.find('\n'));
  return text.empty() ? "a holder that has not named itself yet" : text;
}

class PosixFileLayer final : public FileLayer {
 public:
  absl::Status CreateDir(const std::string& dir) override {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("create ", dir, ": ", ec.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    if (ec) return absl::UnavailableError(absl::StrCat("list ", dir, ": ", ec.message()));
    return names;
  }

  absl::Status ReadFile(const std::string& path, std::string* out) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno(errno, "open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      return Errno(err, "stat", path);
    }
    out->resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < out->size()) {
      const ssize_t n = read(fd, out->data() + done, out->size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        close(fd);
        return Errno(err, "read", path);
      }
      if (n == 0) break;  // shrank meanwhile
      done += static_cast<size_t>(n);
    }
    out->resize(done);
    close(fd);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return Errno(errno, "create", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::Status Truncate(const std::string& path, uint64_t size, bool sync) override {
    if (truncate(path.c_str(), static_cast<off_t>(size)) != 0) return Errno(errno, "truncate", path);
    if (!sync) return absl::OkStatus();
    return OpenAndSync(path, O_WRONLY, fdatasync, "fdatasync");
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) return Errno(errno, "rename", from);
    return absl::OkStatus();
  }

  absl::Status Remove(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return Errno(errno, "delete", path);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    return OpenAndSync(dir, O_RDONLY | O_DIRECTORY, fsync, "fsync");
  }

  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 absl::string_view holder) override {
    // No O_TRUNC: until flock says the lock is ours, the content is the
    // current holder's name, which a refused caller reports.
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Errno(errno, "open", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      absl::Status s =
          err == EWOULDBLOCK
              ? absl::FailedPreconditionError(absl::StrCat(path, " held by ", LockHolder(fd)))
              : Errno(err, "flock", path);
      close(fd);
      return s;
    }
    auto lock = std::make_unique<PosixFileLock>(fd);  // releases it on any error below
    // Ours now: replace the previous holder's name (a stale one, left by a
    // process that has exited) with ours. Written first and cut after, so a
    // refused caller reading in between still finds our name on line one.
    const std::string text = absl::StrCat(holder, "\n");
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t w =
          pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Errno(errno, "write", path);
      done += static_cast<size_t>(w);
    }
    if (ftruncate(fd, static_cast<off_t>(text.size())) != 0) return Errno(errno, "truncate", path);
    return std::unique_ptr<FileLock>(std::move(lock));
  }
};

}  // namespace

FileLayer* FileLayer::Posix() {
  static PosixFileLayer* const layer = new PosixFileLayer();
  return layer;
}

}  // namespace duet
