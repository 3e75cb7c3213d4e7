// Fuzzes duet_spank_parse_args (slurm_plugin/plugin_args.c), the plugstack
// arguments of spank_duet.so, with arbitrary bytes cut at '\n' into argv (each
// argument in its own exact-size heap block, so ASan sees any read past it;
// the error buffer likewise). Checks: the result is 0 or -1; the error
// message is NUL-terminated inside its buffer; on success every string field
// is NUL-terminated inside DUET_ARG_MAX and every number and enum lies in its
// documented range.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "slurm_plugin/plugin_args.h"

namespace {

void CheckTerminated(const char* s, size_t len) {
  if (std::memchr(s, '\0', len) == nullptr) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the error buffer's size (1..64), the rest is argv.
  const size_t err_len = 1 + data[0] % 64;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::unique_ptr<char[]>> store;
  std::vector<const char*> argv;
  size_t start = 0;
  while (start <= rest.size() && argv.size() < 64) {
    size_t end = rest.find('\n', start);
    if (end == std::string::npos) end = rest.size();
    const std::string arg = rest.substr(start, end - start);
    store.emplace_back(new char[arg.size() + 1]);
    std::memcpy(store.back().get(), arg.c_str(), arg.size() + 1);
    argv.push_back(store.back().get());
    start = end + 1;
  }
  auto out = std::make_unique<duet_spank_args>();
  std::unique_ptr<char[]> err(new char[err_len]);
  std::memset(err.get(), 'x', err_len);
  const int rc = duet_spank_parse_args(static_cast<int>(argv.size()), argv.data(), out.get(),
                                       err.get(), err_len);
  if (rc == -1) {
    CheckTerminated(err.get(), err_len);
    return 0;
  }
  if (rc != 0) std::abort();
  CheckTerminated(out->bridge, DUET_ARG_MAX);
  CheckTerminated(out->client, DUET_ARG_MAX);
  CheckTerminated(out->munge_socket, DUET_ARG_MAX);
  CheckTerminated(out->slurm_key, DUET_ARG_MAX);
  if (out->timeout_ms < 1 || out->timeout_ms > 60000) std::abort();
  if (out->on_unreachable != DUET_UNREACHABLE_FAIL && out->on_unreachable != DUET_UNREACHABLE_ALLOW)
    std::abort();
  if (out->tpu != DUET_TPU_AUTO && out->tpu != DUET_TPU_YES && out->tpu != DUET_TPU_NO) std::abort();
  if (out->auth != DUET_AUTH_MUNGE && out->auth != DUET_AUTH_SLURM_KEY && out->auth != DUET_AUTH_NONE)
    std::abort();
  return 0;
}
