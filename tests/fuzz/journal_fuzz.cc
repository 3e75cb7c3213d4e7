// Fuzzes the journal's recovery (bridge/journal/journal.h) with arbitrary
// bytes as one file of the journal's directory. The first input byte picks
// the file: even = a log segment wal-<1>.log, odd = a snapshot
// snapshot-<byte/2>.pb; the rest is its content. Journal::Open must then
// succeed or fail with DATA_LOSS (the documented answer for a corrupt file);
// never crash or give another code. When it succeeds, the recovered ledger
// must pass Ledger::CheckInvariants (no device over-held: I1), and opening
// the same directory again (after the first open truncated any torn tail)
// must recover exactly the same ledger and seq.
//
// Seeds: DUET_JOURNAL_FUZZ_WRITE_SEEDS=<dir> journal_fuzz writes valid
// segments and snapshots from a real ledger into <dir> and exits.

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "bridge/journal/journal.h"
#include "bridge/ledger/ledger.h"
#include "spdlog/spdlog.h"

namespace {

namespace fs = std::filesystem;
using duet::Journal;
using duet::Ledger;

std::string* g_dir = nullptr;

Journal::Options Opts(const std::string& dir) {
  Journal::Options o;
  o.dir = dir;
  o.fsync = false;
  o.snapshot_every = 0;
  return o;
}

// What recovery produced, as one comparable string.
std::string Dump(const Ledger& ledger) {
  std::string s = absl::StrCat("seq ", ledger.seq(), "\n");
  for (const auto& v : ledger.Snapshot().nodes) {
    absl::StrAppend(&s, v->spec.name, " ", duet::NodeStateName(v->spec.state), " g",
                    v->generation);
    for (const duet::DeviceState& d : v->devices) {
      absl::StrAppend(&s, " ", duet::DeviceKindName(d.spec.kind), d.spec.index, ":", d.spec.id,
                      ":", d.spec.capacity_milli, ":", d.used_milli);
    }
    absl::StrAppend(&s, "\n");
  }
  for (const duet::Holding& h : ledger.ListHoldings()) {
    absl::StrAppend(&s, h.node, " ", h.owner.ToString(), " ", absl::FormatTime(h.granted_at),
                    " g", h.generation);
    for (const duet::HeldDevice& d : h.devices) absl::StrAppend(&s, " ", d.index, "@", d.milli);
    absl::StrAppend(&s, "\n");
  }
  return s;
}

void ClearDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

duet::NodeSpec Node(const std::string& name) {
  duet::NodeSpec spec;
  spec.name = name;
  spec.cpus = 8;
  spec.memory_mib = 1024;
  for (uint32_t i = 0; i < 2; ++i) {
    duet::DeviceSpec d;
    d.kind = duet::DeviceKind::kGpu;
    d.index = i;
    d.id = absl::StrCat("GPU-", name, "-", i);
    d.model = "nvidia-h100-80gb";
    spec.devices.push_back(d);
  }
  return spec;
}

// Valid seeds: a log of a few changes, and a snapshot of them.
void WriteSeeds(const std::string& out) {
  const std::string work = *g_dir;
  fs::create_directories(out);
  ClearDir(work);
  {
    Ledger ledger;
    auto j = Journal::Open(Opts(work), &ledger);
    if (!j.ok()) std::abort();
    ledger.UpsertNode(Node("node-0")).IgnoreError();
    ledger.UpsertNode(Node("node-1")).IgnoreError();
    duet::HoldRequest r;
    r.node = "node-0";
    r.owner = duet::Owner::SlurmJob(7);
    r.count = duet::CountSelector{duet::DeviceKind::kGpu, 1, 0, ""};
    ledger.Hold(r).IgnoreError();
    r.owner = duet::Owner::Pod("uid-1", "ns", "p");
    r.count = duet::CountSelector{duet::DeviceKind::kGpu, 1, 500, ""};
    ledger.Hold(r).IgnoreError();
    ledger.Release("node-0", duet::Owner::SlurmJob(7)).IgnoreError();
    (*j)->Flush().IgnoreError();
    for (const auto& e : fs::directory_iterator(work)) {
      // Log segments only (the directory also holds the journal's LOCK).
      if (e.path().filename().string().rfind("wal-", 0) != 0) continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::ofstream o(fs::path(out) / "wal", std::ios::binary);
      o.put('\0');
      o << in.rdbuf();
    }
    (*j)->WriteSnapshot().IgnoreError();
    for (const auto& e : fs::directory_iterator(work)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("snapshot-", 0) != 0) continue;
      const uint64_t seq = std::stoull(name.substr(9, 20));
      std::ifstream in(e.path(), std::ios::binary);
      std::ofstream o(fs::path(out) / "snapshot", std::ios::binary);
      o.put(static_cast<char>(seq * 2 + 1));
      o << in.rdbuf();
    }
  }
  ClearDir(work);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);  // a torn tail logs a warning each time
  std::string tmpl = (fs::temp_directory_path() / "journal_fuzz.XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  g_dir = new std::string(tmpl);
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(*g_dir, ec);
  });
  if (const char* out = std::getenv("DUET_JOURNAL_FUZZ_WRITE_SEEDS")) {
    WriteSeeds(out);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string& dir = *g_dir;
  ClearDir(dir);
  const std::string name = (data[0] % 2 == 0)
                               ? absl::StrFormat("wal-%020d.log", 1)
                               : absl::StrFormat("snapshot-%020d.pb", data[0] / 2);
  WriteFile(dir + "/" + name, data + 1, size - 1);

  std::string first;
  {
    Ledger ledger;
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(Opts(dir), &ledger);
    if (!j.ok()) {
      if (j.status().code() != absl::StatusCode::kDataLoss) {
        std::fprintf(stderr, "Open: %s\n", j.status().ToString().c_str());
        std::abort();
      }
      return 0;
    }
    if (absl::Status s = ledger.CheckInvariants(); !s.ok()) {
      std::fprintf(stderr, "recovered ledger: %s\n", s.ToString().c_str());
      std::abort();
    }
    first = Dump(ledger);
  }
  Ledger again;
  absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(Opts(dir), &again);
  if (!j.ok()) {
    std::fprintf(stderr, "second Open: %s\n", j.status().ToString().c_str());
    std::abort();
  }
  if (Dump(again) != first) {
    std::fprintf(stderr, "second recovery differs:\n%s---\n%s", first.c_str(),
                 Dump(again).c_str());
    std::abort();
  }
  return 0;
}
