#pragma once

// A FileLayer that fails the journal's writes on demand, for soak and fault
// tests of the real daemon (bench/soak). TEST-ONLY: duet-bridge installs it
// only when the environment variable DUET_TEST_JOURNAL_FAULT_FILE names a
// control file (Bridge::OpenJournal); production never sets it.
//
// Contract: before every WritableFile::Append, SyncData and Sync the layer
// reads the control file. Missing or empty: the call goes to `real`. Its
// first word otherwise selects the fault, until the file is removed:
//   ENOSPC  Append fails with "No space left on device"
//   EIO     SyncData/Sync fail with "Input/output error" (the data may have
//           reached the page cache; nothing confirmed it durable)
// Failures are UNAVAILABLE, as FileLayer::Posix() reports them. Every other
// operation (directories, reads, renames, the directory lock) is passed
// through unchanged.
//
// Thread-safety: as FileLayer; the control file is re-read on each call.

#include <memory>
#include <string>

#include "bridge/journal/file_layer.h"

namespace duet {

// `real` is not owned and must outlive the result.
std::unique_ptr<FileLayer> NewControlFileFaultLayer(FileLayer* real, std::string control_file);

}  // namespace duet
