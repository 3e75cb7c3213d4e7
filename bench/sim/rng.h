#pragma once

// SplitMix64 for duet-sim: tiny, and the same sequence on every platform (no
// std:: distributions). Not thread-safe; one per replay or per stream.

#include <cstdint>

namespace duet::sim {

// One SplitMix64 step on a state word the caller keeps (advanced): the
// sequence Rng gives, and the one placement::SelectNode draws its ties from.
inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64(&state_); }
  // Uniform in [0, n), without modulo bias.
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % n;
    }
  }
  // Uniform in [0, 1), 53 bits.
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace duet::sim
