#include "bridge/journal/fault_file_layer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace duet {
namespace {

enum class Fault { kNone, kEnospc, kEio };

Fault ReadFault(const std::string& control_file) {
  std::ifstream in(control_file);
  std::string word;
  if (!in || !(in >> word)) return Fault::kNone;
  if (word == "ENOSPC") return Fault::kEnospc;
  if (word == "EIO") return Fault::kEio;
  return Fault::kNone;
}

class FaultFile final : public WritableFile {
 public:
  FaultFile(std::unique_ptr<WritableFile> real, const std::string* control)
      : real_(std::move(real)), control_(control) {}

  absl::Status Append(absl::string_view data) override {
    if (ReadFault(*control_) == Fault::kEnospc) {
      return absl::UnavailableError(absl::StrCat("write ", path(), ": ", strerror(ENOSPC)));
    }
    return real_->Append(data);
  }
  absl::Status SyncData() override {
    if (ReadFault(*control_) == Fault::kEio) {
      return absl::UnavailableError(absl::StrCat("fdatasync ", path(), ": ", strerror(EIO)));
    }
    return real_->SyncData();
  }
  absl::Status Sync() override {
    if (ReadFault(*control_) == Fault::kEio) {
      return absl::UnavailableError(absl::StrCat("fsync ", path(), ": ", strerror(EIO)));
    }
    return real_->Sync();
  }
  const std::string& path() const override { return real_->path(); }

 private:
  std::unique_ptr<WritableFile> real_;
  const std::string* control_;
};

class ControlFileFaultLayer final : public ForwardingFileLayer {
 public:
  ControlFileFaultLayer(FileLayer* real, std::string control)
      : ForwardingFileLayer(real), control_(std::move(control)) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> f = real()->NewWritableFile(path);
    if (!f.ok()) return f.status();
    return std::unique_ptr<WritableFile>(new FaultFile(*std::move(f), &control_));
  }

 private:
  const std::string control_;
};

}  // namespace

std::unique_ptr<FileLayer> NewControlFileFaultLayer(FileLayer* real, std::string control_file) {
  return std::make_unique<ControlFileFaultLayer>(real, std::move(control_file));
}

}  // namespace duet
