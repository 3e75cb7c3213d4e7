// Fuzzes the step agent's wire codec (common/step_agent/step_wire.c), what
// duet-node's step agent reads from any local root process and what
// spank_duet.so reads back: arbitrary bytes as a request frame and as a reply
// frame (each in an exact-size heap block, so ASan sees any read past it).
// Checks: the result is 0 or -1; a refusal leaves the output untouched and
// says why in a NUL-terminated message; an accepted frame re-encodes to a
// frame that decodes to the same value.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/step_agent/step_wire.h"

namespace {

template <typename T>
void Check(const uint8_t* frame, size_t size,
           int (*decode)(const uint8_t*, size_t, T*, char*, size_t),
           long (*encode)(const T*, uint8_t*, size_t, char*, size_t)) {
  T out, before;
  std::memset(&out, 0xa5, sizeof(out));
  std::memcpy(&before, &out, sizeof(out));
  char err[128];
  const int rc = decode(frame, size, &out, err, sizeof(err));
  if (rc == -1) {
    if (std::memcmp(&out, &before, sizeof(out)) != 0) std::abort();
    if (std::memchr(err, '\0', sizeof(err)) == nullptr || err[0] == '\0') std::abort();
    return;
  }
  if (rc != 0) std::abort();
  std::vector<uint8_t> again(DUET_WIRE_MAX_FRAME);
  const long n = encode(&out, again.data(), again.size(), err, sizeof(err));
  if (n < 0) std::abort();
  T round;
  std::memset(&round, 0, sizeof(round));
  if (decode(again.data(), static_cast<size_t>(n), &round, err, sizeof(err)) != 0) std::abort();
  std::vector<uint8_t> third(DUET_WIRE_MAX_FRAME);
  const long m = encode(&round, third.data(), third.size(), err, sizeof(err));
  if (m != n || std::memcmp(again.data(), third.data(), static_cast<size_t>(n)) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<uint8_t[]> frame(new uint8_t[size == 0 ? 1 : size]);
  if (size) std::memcpy(frame.get(), data, size);
  Check<duet_wire_request>(frame.get(), size, duet_wire_decode_request, duet_wire_encode_request);
  Check<duet_wire_reply>(frame.get(), size, duet_wire_decode_reply, duet_wire_encode_reply);
  return 0;
}
